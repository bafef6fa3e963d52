package signing_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/idemq/idemq/transports/webhook/signing"
)

func headers(id string, at time.Time, sig string) http.Header {
	h := http.Header{}
	h.Set(signing.HeaderID, id)
	h.Set(signing.HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	h.Set(signing.HeaderSignature, sig)
	return h
}

// TestCrossVerifyWithTheReferenceLibrary signs with idemq and verifies with
// the official Go library, and the other way round.
func TestCrossVerifyWithTheReferenceLibrary(t *testing.T) {
	t.Parallel()
	secret := signing.NewSecret()
	keys, err := signing.ParseKeys(secret)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"invoice.paid","data":{"n":1}}`)
	now := time.Now()

	sig := signing.Sign(keys, "msg_1", now, body)
	if err := ref.Verify(body, headers("msg_1", now, sig)); err != nil {
		t.Fatalf("reference library rejects idemq's signature %q: %v", sig, err)
	}
	refSig, err := ref.Sign("msg_2", now, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := signing.Verify(keys, "msg_2", strconv.FormatInt(now.Unix(), 10), refSig, body, 5*time.Minute, now); err != nil {
		t.Fatalf("idemq rejects the reference library's signature %q: %v", refSig, err)
	}
	// The reference library's test vector.
	vec, err := signing.ParseKeys("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1614265330, 0)
	if got, want := signing.Sign(vec, "msg_p5jXN8AQM9LWM0D4loKWxJek", at, []byte(`{"test": 2432232314}`)), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("test vector: got %s, want %s", got, want)
	}
}

// TestKeyRingSignsWithEveryKey: a ring of an HMAC secret and an ed25519
// key signs with both; a receiver holding either one verifies.
func TestKeyRingSignsWithEveryKey(t *testing.T) {
	t.Parallel()
	secret := signing.NewSecret()
	private, public := signing.NewSigningKey()
	ring, err := signing.ParseKeys(secret, private)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{}`)
	now := time.Now()
	sig := signing.Sign(ring, "msg", now, body)
	entries := strings.Fields(sig)
	if len(entries) != 2 || !strings.HasPrefix(entries[0], "v1,") || !strings.HasPrefix(entries[1], "v1a,") {
		t.Fatalf("signature %q: want a v1 and a v1a entry", sig)
	}
	ts := strconv.FormatInt(now.Unix(), 10)
	for _, k := range []string{secret, public, private} {
		keys, err := signing.ParseKeys(k)
		if err != nil {
			t.Fatal(err)
		}
		if err := signing.Verify(keys, "msg", ts, sig, body, time.Minute, now); err != nil {
			t.Errorf("key %.8s…: %v", k, err)
		}
	}
	if pk, _ := signing.ParseKey(private); pk.Public() != public {
		t.Fatalf("Public() = %s, want %s", pk.Public(), public)
	}
}

func TestVerifyRejects(t *testing.T) {
	t.Parallel()
	secret := signing.NewSecret()
	private, public := signing.NewSigningKey()
	ring, _ := signing.ParseKeys(secret, private)
	verifyWith, _ := signing.ParseKeys(secret, public)
	other, _ := signing.ParseKeys(signing.NewSecret())
	body := []byte(`{"a":1}`)
	now := time.Now()
	ts := func(at time.Time) string { return strconv.FormatInt(at.Unix(), 10) }
	good := signing.Sign(ring, "id", now, body)
	cases := []struct {
		name        string
		keys        []signing.Key
		id, ts, sig string
		body        []byte
		want        error
	}{
		{"wrong key", other, "id", ts(now), good, body, signing.ErrBadSignature},
		{"tampered body", verifyWith, "id", ts(now), good, []byte(`{"a":2}`), signing.ErrBadSignature},
		{"other id", verifyWith, "id2", ts(now), good, body, signing.ErrBadSignature},
		{"stale", verifyWith, "id", ts(now.Add(-10 * time.Minute)), signing.Sign(ring, "id", now.Add(-10*time.Minute), body), body, signing.ErrBadTimestamp},
		{"future", verifyWith, "id", ts(now.Add(10 * time.Minute)), signing.Sign(ring, "id", now.Add(10*time.Minute), body), body, signing.ErrBadTimestamp},
		{"garbage timestamp", verifyWith, "id", "yesterday", good, body, signing.ErrBadTimestamp},
		{"missing signature", verifyWith, "id", ts(now), "", body, signing.ErrMissingHeaders},
		{"unknown scheme", verifyWith, "id", ts(now), "v2," + strings.TrimPrefix(strings.Fields(good)[0], "v1,"), body, signing.ErrBadSignature},
		{"v1 entry checked against the public key only", func() []signing.Key { k, _ := signing.ParseKeys(public); return k }(), "id", ts(now), strings.Fields(good)[0], body, signing.ErrBadSignature},
	}
	for _, c := range cases {
		if err := signing.Verify(c.keys, c.id, c.ts, c.sig, c.body, 5*time.Minute, now); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if err := signing.Verify(verifyWith, "id", ts(now), good, body, 5*time.Minute, now); err != nil {
		t.Fatalf("the good message: %v", err)
	}
}

func TestParseKeyRejects(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"", "secret", "whsec_!!", "whsec_c2hvcnQ=", "whpk_c2hvcnQ=", "whsk_c2hvcnQ="} {
		if _, err := signing.ParseKey(k); !errors.Is(err, signing.ErrInvalidSigningKey) {
			t.Errorf("ParseKey(%q) = %v, want ErrInvalidKey", k, err)
		}
	}
}
