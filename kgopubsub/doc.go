package kgopubsub
