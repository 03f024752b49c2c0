// Package rebalancebench measures how long a consumer-group rebalance stops
// consumption, per group protocol: kafkapubsub's eager group (kafka-go),
// and kgopubsub's cooperative-sticky, static (InstanceID) and KIP-848
// members. It has no code of its own outside its benchmark:
//
//	TEST_KAFKA_BROKERS=127.0.0.1:9092 go test -run '^$' -bench Rebalance -benchtime 1x -timeout 60m ./internal/rebalancebench
//
// (from kgopubsub/). Each group member is a process of its own (the test
// binary run again as a worker), so that a kill -9 is one.
package rebalancebench
