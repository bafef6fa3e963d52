package signing

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Key prefixes of the Standard Webhooks serialisation.
const (
	// SecretPrefix starts an HMAC-SHA256 secret (scheme v1).
	SecretPrefix = "whsec_"
	// PrivateKeyPrefix starts an ed25519 signing key (scheme v1a, sender side).
	PrivateKeyPrefix = "whsk_"
	// PublicKeyPrefix starts an ed25519 verification key (scheme v1a,
	// receiver side).
	PublicKeyPrefix = "whpk_"
)

// Header names of Standard Webhooks: the three values [Verify] checks.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// ErrInvalidSigningKey is matched by the errors of [ParseKey] and of
// everything that parses a key ring (the registry, the Receiver's
// config). The name says which key: a whsec_, whsk_ or whpk_ key of a
// ring, never an idempotency key (request.ErrInvalidKey).
var ErrInvalidSigningKey = errors.New("webhook: invalid signing key")

// Key is one parsed signing or verification key. Its zero value is not a
// key; build one with [ParseKey], [NewSecret] or [NewSigningKey].
type Key struct {
	hmac []byte             // v1
	priv ed25519.PrivateKey // v1a, signing
	pub  ed25519.PublicKey  // v1a, verifying
}

// ParseKey parses a serialised key: "whsec_" + base64 of 24 to 64 random
// bytes (HMAC-SHA256), "whsk_" + base64 of an ed25519 seed (32 bytes) or
// private key (64 bytes), or "whpk_" + base64 of an ed25519 public key.
func ParseKey(s string) (Key, error) {
	decode := func(prefix string) ([]byte, error) {
		b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, prefix))
		if err != nil {
			return nil, fmt.Errorf("%w: %s key is not base64: %v", ErrInvalidSigningKey, prefix, err)
		}
		return b, nil
	}
	switch {
	case strings.HasPrefix(s, SecretPrefix):
		b, err := decode(SecretPrefix)
		if err != nil {
			return Key{}, err
		}
		if len(b) < 24 || len(b) > 64 {
			return Key{}, fmt.Errorf("%w: %s secret has %d bytes, want 24 to 64", ErrInvalidSigningKey, SecretPrefix, len(b))
		}
		return Key{hmac: b}, nil
	case strings.HasPrefix(s, PrivateKeyPrefix):
		b, err := decode(PrivateKeyPrefix)
		if err != nil {
			return Key{}, err
		}
		switch len(b) {
		case ed25519.SeedSize:
			priv := ed25519.NewKeyFromSeed(b)
			return Key{priv: priv, pub: priv.Public().(ed25519.PublicKey)}, nil
		case ed25519.PrivateKeySize:
			// The second half is the public key; it must be the seed's, or
			// signatures would fail at every receiver.
			priv := ed25519.NewKeyFromSeed(b[:ed25519.SeedSize])
			if !bytes.Equal(priv[ed25519.SeedSize:], b[ed25519.SeedSize:]) {
				return Key{}, fmt.Errorf("%w: %s key's public half is not its seed's: the key is corrupt or spliced from two keys", ErrInvalidSigningKey, PrivateKeyPrefix)
			}
			return Key{priv: priv, pub: priv.Public().(ed25519.PublicKey)}, nil
		}
		return Key{}, fmt.Errorf("%w: %s key has %d bytes, want %d or %d", ErrInvalidSigningKey, PrivateKeyPrefix, len(b), ed25519.SeedSize, ed25519.PrivateKeySize)
	case strings.HasPrefix(s, PublicKeyPrefix):
		b, err := decode(PublicKeyPrefix)
		if err != nil {
			return Key{}, err
		}
		if len(b) != ed25519.PublicKeySize {
			return Key{}, fmt.Errorf("%w: %s key has %d bytes, want %d", ErrInvalidSigningKey, PublicKeyPrefix, len(b), ed25519.PublicKeySize)
		}
		return Key{pub: b}, nil
	}
	return Key{}, fmt.Errorf("%w: want a %s, %s or %s prefix", ErrInvalidSigningKey, SecretPrefix, PrivateKeyPrefix, PublicKeyPrefix)
}

// NewSecret returns a fresh "whsec_" secret of 32 random bytes.
func NewSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand never fails
	return SecretPrefix + base64.StdEncoding.EncodeToString(b)
}

// NewSigningKey returns a fresh ed25519 key pair: the "whsk_" key for the
// endpoint's key ring and the "whpk_" key to hand to the receiver.
func NewSigningKey() (private, public string) {
	pub, priv, _ := ed25519.GenerateKey(rand.Reader) // crypto/rand never fails
	return PrivateKeyPrefix + base64.StdEncoding.EncodeToString(priv.Seed()),
		PublicKeyPrefix + base64.StdEncoding.EncodeToString(pub)
}

// Signs reports whether k can sign: an HMAC secret or an ed25519 private
// key. A ring that no key of can sign fails every delivery, so the
// registry refuses it.
func (k Key) Signs() bool { return k.hmac != nil || k.priv != nil }

// Public returns the "whpk_" form of an ed25519 key, "" for an HMAC secret.
func (k Key) Public() string {
	if k.pub == nil {
		return ""
	}
	return PublicKeyPrefix + base64.StdEncoding.EncodeToString(k.pub)
}

// ParseKeys parses every key of a ring; see [ParseKey].
func ParseKeys(keys ...string) ([]Key, error) {
	out := make([]Key, 0, len(keys))
	for i, s := range keys {
		k, err := ParseKey(s)
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		out = append(out, k)
	}
	return out, nil
}

// signedContent is what both schemes sign: id.timestamp.body.
func signedContent(id string, ts int64, body []byte) []byte {
	var b bytes.Buffer
	b.Grow(len(id) + 22 + len(body))
	b.WriteString(id)
	b.WriteByte('.')
	b.WriteString(strconv.FormatInt(ts, 10))
	b.WriteByte('.')
	b.Write(body)
	return b.Bytes()
}

// Sign returns the webhook-signature header value for a message: one
// space-separated entry per key that can sign ("v1,<base64>" for a secret,
// "v1a,<base64>" for an ed25519 private key), so that a receiver holding
// any one of the keys verifies it; public keys are skipped.
func Sign(keys []Key, id string, at time.Time, body []byte) string {
	content := signedContent(id, at.Unix(), body)
	var parts []string
	for _, k := range keys {
		switch {
		case k.hmac != nil:
			m := hmac.New(sha256.New, k.hmac)
			m.Write(content)
			parts = append(parts, "v1,"+base64.StdEncoding.EncodeToString(m.Sum(nil)))
		case k.priv != nil:
			parts = append(parts, "v1a,"+base64.StdEncoding.EncodeToString(ed25519.Sign(k.priv, content)))
		}
	}
	return strings.Join(parts, " ")
}

// Verification errors; all of them make the receiver answer 401.
var (
	ErrMissingHeaders = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	ErrBadTimestamp   = errors.New("webhook: timestamp outside the tolerance")
	ErrBadSignature   = errors.New("webhook: no signature matches")
)

// Verify checks a message against its headers' values: the timestamp
// (Unix seconds) within tolerance of now in either direction, and at least
// one signature entry that one of keys verifies. Comparisons take constant
// time. Entries of unknown schemes are ignored.
func Verify(keys []Key, id, timestamp, signature string, body []byte, tolerance time.Duration, now time.Time) error {
	if id == "" || timestamp == "" || signature == "" {
		return ErrMissingHeaders
	}
	ts, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %q is not Unix seconds", ErrBadTimestamp, timestamp)
	}
	if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: %v off", ErrBadTimestamp, d.Round(time.Second))
	}
	content := signedContent(id, ts, body)
	var mac []byte // computed once per secret on demand
	for entry := range strings.FieldsSeq(signature) {
		scheme, b64, ok := strings.Cut(entry, ",")
		if !ok {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			continue
		}
		for _, k := range keys {
			switch {
			case scheme == "v1" && k.hmac != nil:
				m := hmac.New(sha256.New, k.hmac)
				m.Write(content)
				mac = m.Sum(mac[:0])
				if subtle.ConstantTimeCompare(mac, sig) == 1 {
					return nil
				}
			case scheme == "v1a" && k.pub != nil && len(sig) == ed25519.SignatureSize:
				if ed25519.Verify(k.pub, content, sig) {
					return nil
				}
			}
		}
	}
	return ErrBadSignature
}
