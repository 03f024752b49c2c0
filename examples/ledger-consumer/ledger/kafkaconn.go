package ledger

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
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

// saslMechanisms are the --kafka-sasl mechanisms, by name.
var saslMechanisms = map[string]func(user, password string) (sasl.Mechanism, error){
	"plain":         func(u, p string) (sasl.Mechanism, error) { return plain.Mechanism{Username: u, Password: p}, nil },
	"scram-sha-256": func(u, p string) (sasl.Mechanism, error) { return scram.Mechanism(scram.SHA256, u, p) },
	"scram-sha-512": func(u, p string) (sasl.Mechanism, error) { return scram.Mechanism(scram.SHA512, u, p) },
}

// sasl is nil unless --kafka-sasl is set.
func (k *kafkaConn) sasl() (sasl.Mechanism, error) {
	pw := os.Getenv("KAFKA_SASL_PASSWORD")
	mechanism, ok := saslMechanisms[strings.ToLower(k.mechanism)]
	switch {
	case k.mechanism == "" && k.user != "":
		return nil, errors.New("--kafka-sasl-user is set but --kafka-sasl is not: name the mechanism (plain, scram-sha-256, scram-sha-512)")
	case k.mechanism == "":
		return nil, nil
	case k.user == "" || pw == "":
		return nil, fmt.Errorf("--kafka-sasl %s needs --kafka-sasl-user and $KAFKA_SASL_PASSWORD", k.mechanism)
	case !ok:
		return nil, fmt.Errorf("--kafka-sasl %q: use plain, scram-sha-256 or scram-sha-512", k.mechanism)
	}
	m, err := mechanism(k.user, pw)
	if err != nil {
		return nil, fmt.Errorf("--kafka-sasl %s: %w", k.mechanism, err)
	}
	return m, nil
}
