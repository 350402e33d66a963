# Runs TOOL with the list ARGS and fails unless it exits with STATUS, its
# standard error matches PATTERN and, with OUTPUT_PATTERN, its standard output
# matches that. With MEMORY_LIMIT_KB the tool runs under that address-space
# limit (ulimit -v).
if(DEFINED MEMORY_LIMIT_KB)
  set(command sh -c "ulimit -v ${MEMORY_LIMIT_KB} && exec \"$0\" \"$@\"" ${TOOL} ${ARGS})
else()
  set(command ${TOOL} ${ARGS})
endif()
execute_process(COMMAND ${command} RESULT_VARIABLE result OUTPUT_VARIABLE output ERROR_VARIABLE error)
if(NOT result STREQUAL STATUS)
  message(FATAL_ERROR "expected exit status ${STATUS}, got '${result}'; standard error:\n${error}")
endif()
if(NOT error MATCHES "${PATTERN}")
  message(FATAL_ERROR "standard error does not match '${PATTERN}':\n${error}")
endif()
if(DEFINED OUTPUT_PATTERN AND NOT output MATCHES "${OUTPUT_PATTERN}")
  message(FATAL_ERROR "standard output does not match '${OUTPUT_PATTERN}':\n${output}")
endif()
