//go:build !race

package kgopubsub_test

const raceDetector = false
