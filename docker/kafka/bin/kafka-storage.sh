#!/bin/bash
# kafka-storage.sh format|random-uuid|info ...
: "${KAFKA_HEAP_OPTS:=-Xmx128m}"
export KAFKA_HEAP_OPTS
exec "$(dirname "$0")/kafka-run-class.sh" kafka.tools.StorageTool "$@"
