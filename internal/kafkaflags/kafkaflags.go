// Package kafkaflags gives the project's commands the same Kafka connection
// flags: TLS and SASL settings turned into a kafkapubsub.Security, and the
// Publisher's partitioner.
package kafkaflags

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	"github.com/exactly-go/exactly/kafkapubsub"
)

// Flags holds the connection flags. The password is read from
// $KAFKA_SASL_PASSWORD, never from a flag (flags show in ps).
type Flags struct {
	TLS                bool
	CAFile             string
	CertFile, KeyFile  string
	InsecureSkipVerify bool
	SASLMechanism      string
	SASLUser           string
	Partitioner        string
}

// Register adds the flags to fs, with defaults from the environment
// (KAFKA_TLS, KAFKA_TLS_CA, KAFKA_TLS_CERT, KAFKA_TLS_KEY, KAFKA_SASL_MECHANISM,
// KAFKA_SASL_USER, KAFKA_PARTITIONER; the password only from
// KAFKA_SASL_PASSWORD).
func (f *Flags) Register(fs *flag.FlagSet) {
	fs.BoolVar(&f.TLS, "kafka-tls", os.Getenv("KAFKA_TLS") == "true", "connect to Kafka over TLS (default $KAFKA_TLS=true)")
	fs.StringVar(&f.CAFile, "kafka-tls-ca", os.Getenv("KAFKA_TLS_CA"), "PEM file of the CAs that sign the brokers' certificates (default the system's; $KAFKA_TLS_CA)")
	fs.StringVar(&f.CertFile, "kafka-tls-cert", os.Getenv("KAFKA_TLS_CERT"), "client certificate, PEM, for mutual TLS ($KAFKA_TLS_CERT)")
	fs.StringVar(&f.KeyFile, "kafka-tls-key", os.Getenv("KAFKA_TLS_KEY"), "client key, PEM, for mutual TLS ($KAFKA_TLS_KEY)")
	fs.BoolVar(&f.InsecureSkipVerify, "kafka-tls-insecure-skip-verify", false, "do not verify the brokers' certificates (tests only)")
	fs.StringVar(&f.SASLMechanism, "kafka-sasl", os.Getenv("KAFKA_SASL_MECHANISM"), "SASL mechanism: plain, scram-sha-256 or scram-sha-512 (default none; $KAFKA_SASL_MECHANISM); the password comes from $KAFKA_SASL_PASSWORD")
	fs.StringVar(&f.SASLUser, "kafka-sasl-user", os.Getenv("KAFKA_SASL_USER"), "SASL user name ($KAFKA_SASL_USER)")
	fs.StringVar(&f.Partitioner, "partitioner", os.Getenv("KAFKA_PARTITIONER"), "how published records are spread over partitions by key: murmur2 (Java, franz-go; the default), fnv1a (sarama, watermill-kafka) or crc32 (librdkafka); match the topic's other producers ($KAFKA_PARTITIONER)")
}

// Security returns the settings the flags describe, or an error that names
// the flag to fix.
func (f *Flags) Security() (kafkapubsub.Security, error) {
	var sec kafkapubsub.Security
	if f.TLS || f.CAFile != "" || f.CertFile != "" || f.KeyFile != "" || f.InsecureSkipVerify {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: f.InsecureSkipVerify}
		if f.CAFile != "" {
			pem, err := os.ReadFile(f.CAFile)
			if err != nil {
				return sec, fmt.Errorf("--kafka-tls-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return sec, fmt.Errorf("--kafka-tls-ca: no PEM certificate in %s", f.CAFile)
			}
			cfg.RootCAs = pool
		}
		if (f.CertFile == "") != (f.KeyFile == "") {
			return sec, errors.New("--kafka-tls-cert and --kafka-tls-key go together: set both for mutual TLS, or neither")
		}
		if f.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
			if err != nil {
				return sec, fmt.Errorf("--kafka-tls-cert/--kafka-tls-key: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		sec.TLS = cfg
	}
	if f.SASLMechanism == "" {
		if f.SASLUser != "" {
			return sec, errors.New("--kafka-sasl-user is set but --kafka-sasl is not: name the mechanism (plain, scram-sha-256, scram-sha-512)")
		}
		return sec, nil
	}
	pw := os.Getenv("KAFKA_SASL_PASSWORD")
	if f.SASLUser == "" || pw == "" {
		return sec, fmt.Errorf("--kafka-sasl %s needs --kafka-sasl-user and $KAFKA_SASL_PASSWORD", f.SASLMechanism)
	}
	var (
		m   sasl.Mechanism
		err error
	)
	switch strings.ToLower(f.SASLMechanism) {
	case "plain":
		m = plain.Mechanism{Username: f.SASLUser, Password: pw}
	case "scram-sha-256":
		m, err = scram.Mechanism(scram.SHA256, f.SASLUser, pw)
	case "scram-sha-512":
		m, err = scram.Mechanism(scram.SHA512, f.SASLUser, pw)
	default:
		return sec, fmt.Errorf("--kafka-sasl %q: use plain, scram-sha-256 or scram-sha-512", f.SASLMechanism)
	}
	if err != nil {
		return sec, fmt.Errorf("--kafka-sasl %s: %w", f.SASLMechanism, err)
	}
	sec.SASL = m
	return sec, nil
}

// PublisherPartitioner returns the --partitioner flag's Partitioner.
func (f *Flags) PublisherPartitioner() (kafkapubsub.Partitioner, error) {
	p, err := kafkapubsub.ParsePartitioner(f.Partitioner)
	if err != nil {
		return "", fmt.Errorf("--partitioner: %w", err)
	}
	return p, nil
}
