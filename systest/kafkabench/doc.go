// Package kafkabench compares this project's Subscriber with other Kafka
// consumers for Watermill, side by side on one workload. It is a module of
// its own so that watermill-kafka and sarama stay out of the library's
// go.mod. Run:
//
//	go test -run '^$' -bench Subscriber -benchtime 3x ./systest/kafkabench
package kafkabench
