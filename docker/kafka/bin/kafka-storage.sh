#!/bin/bash
# kafka-storage.sh format|random-uuid|info ...
# A short-lived JVM: the client compiler only, and a small serial heap, so
# that it starts fast on a busy machine.
: "${KAFKA_HEAP_OPTS:=-Xmx128m}"
: "${KAFKA_JVM_PERFORMANCE_OPTS:=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"
export KAFKA_HEAP_OPTS KAFKA_JVM_PERFORMANCE_OPTS
exec "$(dirname "$0")/kafka-run-class.sh" kafka.tools.StorageTool "$@"
