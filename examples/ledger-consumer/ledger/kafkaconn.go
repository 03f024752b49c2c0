package ledger

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

// kafkaConn is how the worker connects to Kafka: TLS, SASL and the
// partitioner of what it publishes. The flags default to the environment;
// the SASL password comes from $KAFKA_SASL_PASSWORD only (flags show in ps).
type kafkaConn struct {
	tls, insecure          bool
	ca, cert, key          string
	mechanism, user, parts string
}

func (k *kafkaConn) register(fs *flag.FlagSet) {
	env := os.Getenv
	fs.BoolVar(&k.tls, "kafka-tls", env("KAFKA_TLS") == "true", "connect to Kafka over TLS (default $KAFKA_TLS=true)")
	fs.StringVar(&k.ca, "kafka-tls-ca", env("KAFKA_TLS_CA"), "PEM file of the CAs that sign the brokers' certificates (default the system's; $KAFKA_TLS_CA)")
	fs.StringVar(&k.cert, "kafka-tls-cert", env("KAFKA_TLS_CERT"), "client certificate, PEM, for mutual TLS ($KAFKA_TLS_CERT)")
	fs.StringVar(&k.key, "kafka-tls-key", env("KAFKA_TLS_KEY"), "client key, PEM, for mutual TLS ($KAFKA_TLS_KEY)")
	fs.BoolVar(&k.insecure, "kafka-tls-insecure-skip-verify", false, "do not verify the brokers' certificates (tests only)")
	fs.StringVar(&k.mechanism, "kafka-sasl", env("KAFKA_SASL_MECHANISM"), "SASL mechanism: plain, scram-sha-256 or scram-sha-512 (default none; $KAFKA_SASL_MECHANISM); the password comes from $KAFKA_SASL_PASSWORD")
	fs.StringVar(&k.user, "kafka-sasl-user", env("KAFKA_SASL_USER"), "SASL user name ($KAFKA_SASL_USER)")
	fs.StringVar(&k.parts, "partitioner", env("KAFKA_PARTITIONER"), "how published records are spread over partitions by key: murmur2 (Java, franz-go; the default), fnv1a (sarama, watermill-kafka) or crc32 (librdkafka); match the topic's other producers ($KAFKA_PARTITIONER)")
}

// settings returns what the flags describe, or an error that names the
// flag to fix.
func (k *kafkaConn) settings() (sec kafkapubsub.Security, part kafkapubsub.Partitioner, err error) {
	if sec.TLS, err = k.tlsConfig(); err != nil {
		return sec, "", err
	}
	if sec.SASL, err = k.sasl(); err != nil {
		return sec, "", err
	}
	if part, err = kafkapubsub.ParsePartitioner(k.parts); err != nil {
		return sec, "", fmt.Errorf("--partitioner: %w", err)
	}
	return sec, part, nil
}

// tlsConfig is nil unless a TLS flag is set.
func (k *kafkaConn) tlsConfig() (*tls.Config, error) {
	if !k.tls && k.ca == "" && k.cert == "" && k.key == "" && !k.insecure {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: k.insecure}
	if k.ca != "" {
		pem, err := os.ReadFile(k.ca)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--kafka-tls-ca: no PEM certificate in %s", k.ca)
		}
	}
	switch {
	case (k.cert == "") != (k.key == ""):
		return nil, errors.New("--kafka-tls-cert and --kafka-tls-key go together: set both for mutual TLS, or neither")
	case k.cert != "":
		pair, err := tls.LoadX509KeyPair(k.cert, k.key)
		if err != nil {
			return nil, fmt.Errorf("--kafka-tls-cert/--kafka-tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// sasl is nil unless --kafka-sasl is set.
func (k *kafkaConn) sasl() (sasl.Mechanism, error) {
	if k.mechanism == "" {
		if k.user != "" {
			return nil, errors.New("--kafka-sasl-user is set but --kafka-sasl is not: name the mechanism (plain, scram-sha-256, scram-sha-512)")
		}
		return nil, nil
	}
	pw := os.Getenv("KAFKA_SASL_PASSWORD")
	if k.user == "" || pw == "" {
		return nil, fmt.Errorf("--kafka-sasl %s needs --kafka-sasl-user and $KAFKA_SASL_PASSWORD", k.mechanism)
	}
	var (
		m   sasl.Mechanism
		err error
	)
	switch strings.ToLower(k.mechanism) {
	case "plain":
		return plain.Mechanism{Username: k.user, Password: pw}, nil
	case "scram-sha-256":
		m, err = scram.Mechanism(scram.SHA256, k.user, pw)
	case "scram-sha-512":
		m, err = scram.Mechanism(scram.SHA512, k.user, pw)
	default:
		return nil, fmt.Errorf("--kafka-sasl %q: use plain, scram-sha-256 or scram-sha-512", k.mechanism)
	}
	if err != nil {
		return nil, fmt.Errorf("--kafka-sasl %s: %w", k.mechanism, err)
	}
	return m, nil
}
