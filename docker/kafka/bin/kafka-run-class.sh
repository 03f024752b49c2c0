#!/bin/bash
# kafka-run-class.sh CLASS ARGS...: runs a Kafka class on the image's jars.
: "${KAFKA_LOG4J_OPTS:=-Dlog4j2.configurationFile=/opt/kafka/config/log4j2.properties}"
# shellcheck disable=SC2086
exec java $KAFKA_HEAP_OPTS $KAFKA_JVM_PERFORMANCE_OPTS $KAFKA_LOG4J_OPTS $KAFKA_OPTS \
	-Djava.awt.headless=true -cp '/opt/kafka/libs/*' "$@"
