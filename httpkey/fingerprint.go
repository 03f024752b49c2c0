package httpkey

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"mime"
	"net/http"
	"strings"

	"github.com/exactly-go/exactly/dedupe"
)

// fingerprint is the SHA-256 of the request's method, route, body (in its
// canonical form when it is JSON and has one) and the named headers, each
// field length-prefixed so that no two requests share an encoding.
func fingerprint(r *http.Request, route string, body []byte, headers []string) dedupe.Fingerprint {
	h := sha256.New()
	field(h, "httpkey/1")
	field(h, r.Method)
	field(h, route)
	if isJSON(r.Header.Get("Content-Type")) {
		if c, err := dedupe.CanonicalJSON(body); err == nil {
			field(h, "json")
			field(h, string(c))
		} else {
			field(h, "raw")
			field(h, string(body))
		}
	} else {
		field(h, "raw")
		field(h, string(body))
	}
	for _, name := range headers {
		vs := r.Header.Values(name)
		field(h, http.CanonicalHeaderKey(name))
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(vs)))
		h.Write(n[:])
		for _, v := range vs {
			field(h, v)
		}
	}
	return dedupe.Fingerprint(hex.EncodeToString(h.Sum(nil)))
}

func field(h hash.Hash, s string) {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(s)))
	h.Write(n[:])
	h.Write([]byte(s))
}

// isJSON: application/json or a +json media type.
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
