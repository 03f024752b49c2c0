//go:build race

package kafkapubsub_test

const raceDetector = true
