# expect.cmake — runs one CLI command and checks its exit code and output:
#   cmake -DCMD="exe|arg|..." -DRC=<code> [-DSTDERR=<regex>] [-DSTDOUT=<regex>]
#         [-DREJECT=<regex>] -P expect.cmake
# RC: the exit code wanted ("nonzero" for any but 0); STDERR / STDOUT: regexes
# the stream must match; REJECT: a regex neither stream may match.
string(REPLACE "|" ";" CMD "${CMD}") # '|' separates the arguments (';' would split -D)
execute_process(COMMAND ${CMD} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(show "command: ${CMD}\nexit code: ${rc}\nstdout:\n${out}\nstderr:\n${err}")
if(RC STREQUAL "nonzero")
  if(rc EQUAL 0)
    message(FATAL_ERROR "want a nonzero exit code\n${show}")
  endif()
elseif(NOT rc EQUAL RC)
  message(FATAL_ERROR "want exit code ${RC}\n${show}")
endif()
if(DEFINED STDERR AND NOT err MATCHES "${STDERR}")
  message(FATAL_ERROR "stderr does not match '${STDERR}'\n${show}")
endif()
if(DEFINED STDOUT AND NOT out MATCHES "${STDOUT}")
  message(FATAL_ERROR "stdout does not match '${STDOUT}'\n${show}")
endif()
if(DEFINED REJECT AND ("${out}${err}" MATCHES "${REJECT}"))
  message(FATAL_ERROR "the output matches '${REJECT}', which it must not\n${show}")
endif()
