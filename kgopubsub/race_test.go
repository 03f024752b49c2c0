//go:build race

package kgopubsub_test

const raceDetector = true
