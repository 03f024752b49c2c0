#!/bin/bash
: "${KAFKA_HEAP_OPTS:=-Xmx128m}"
: "${KAFKA_JVM_PERFORMANCE_OPTS:=-XX:TieredStopAtLevel=1 -XX:+UseSerialGC}"
: "${KAFKA_LOG4J_OPTS:=-Dlog4j2.configurationFile=/opt/kafka/config/tools-log4j2.properties}"
export KAFKA_HEAP_OPTS KAFKA_JVM_PERFORMANCE_OPTS KAFKA_LOG4J_OPTS
exec "$(dirname "$0")/kafka-run-class.sh" org.apache.kafka.tools.BrokerApiVersionsCommand "$@"
