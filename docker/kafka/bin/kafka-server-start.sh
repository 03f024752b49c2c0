#!/bin/bash
# kafka-server-start.sh server.properties
: "${KAFKA_HEAP_OPTS:=-Xmx512m -Xms512m}"
: "${KAFKA_JVM_PERFORMANCE_OPTS:=-XX:+UseG1GC -XX:MaxGCPauseMillis=20}"
export KAFKA_HEAP_OPTS KAFKA_JVM_PERFORMANCE_OPTS
exec "$(dirname "$0")/kafka-run-class.sh" kafka.Kafka "$@"
