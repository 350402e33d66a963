# Runs TOOL with the list ARGS and fails unless it exits with STATUS and its
# standard error matches PATTERN. With MEMORY_LIMIT_KB the tool runs under that
# address-space limit (ulimit -v).
if(DEFINED MEMORY_LIMIT_KB)
  set(command sh -c "ulimit -v ${MEMORY_LIMIT_KB} && exec \"$0\" \"$@\"" ${TOOL} ${ARGS})
else()
  set(command ${TOOL} ${ARGS})
endif()
execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_QUIET ERROR_VARIABLE error)
if(NOT result STREQUAL STATUS)
  message(FATAL_ERROR "expected exit status ${STATUS}, got '${result}'; standard error:\n${error}")
endif()
if(NOT error MATCHES "${PATTERN}")
  message(FATAL_ERROR "standard error does not match '${PATTERN}':\n${error}")
endif()
