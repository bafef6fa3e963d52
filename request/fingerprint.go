package request

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Fingerprint returns the SHA-256 of parts, each prefixed by its length so
// that no two different lists of parts share a fingerprint ("ab","c" and
// "a","bc" differ). Front ends fingerprint a request as the method, the
// route and a canonical digest of the body.
func Fingerprint(parts ...[]byte) []byte {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, p := range parts {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(p)))])
		h.Write(p)
	}
	return h.Sum(nil)
}

// MaxFingerprintLen bounds a fingerprint: it is a digest, not a payload.
const MaxFingerprintLen = 64

// CheckFingerprint reports a fingerprint over MaxFingerprintLen bytes as an
// error wrapping [ErrMisconfigured]: the server computed it, so the
// server's fingerprint function is at fault, not the client.
func CheckFingerprint(fingerprint []byte) error {
	if len(fingerprint) > MaxFingerprintLen {
		return fmt.Errorf("%w: the fingerprint function returned %d bytes, over the limit of %d; return a digest such as SHA-256 (request.Fingerprint)",
			ErrMisconfigured, len(fingerprint), MaxFingerprintLen)
	}
	return nil
}
