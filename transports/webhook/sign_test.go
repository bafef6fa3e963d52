package webhook_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/idemq/idemq/transports/webhook"
)

func headers(id string, at time.Time, sig string) http.Header {
	h := http.Header{}
	h.Set(webhook.HeaderID, id)
	h.Set(webhook.HeaderTimestamp, strconv.FormatInt(at.Unix(), 10))
	h.Set(webhook.HeaderSignature, sig)
	return h
}

// TestCrossVerifyWithTheReferenceLibrary signs with idemq and verifies with
// the official Go library, and the other way round.
func TestCrossVerifyWithTheReferenceLibrary(t *testing.T) {
	t.Parallel()
	secret := webhook.NewSecret()
	keys, err := webhook.ParseKeys(secret)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{"type":"invoice.paid","data":{"n":1}}`)
	now := time.Now()

	sig := webhook.Sign(keys, "msg_1", now, body)
	if err := ref.Verify(body, headers("msg_1", now, sig)); err != nil {
		t.Fatalf("reference library rejects idemq's signature %q: %v", sig, err)
	}
	refSig, err := ref.Sign("msg_2", now, body)
	if err != nil {
		t.Fatal(err)
	}
	if err := webhook.Verify(keys, "msg_2", strconv.FormatInt(now.Unix(), 10), refSig, body, 5*time.Minute, now); err != nil {
		t.Fatalf("idemq rejects the reference library's signature %q: %v", refSig, err)
	}
	// The reference library's test vector.
	vec, err := webhook.ParseKeys("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1614265330, 0)
	if got, want := webhook.Sign(vec, "msg_p5jXN8AQM9LWM0D4loKWxJek", at, []byte(`{"test": 2432232314}`)), "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("test vector: got %s, want %s", got, want)
	}
}

// TestKeyRingSignsWithEveryKey: a ring of an HMAC secret and an ed25519
// key signs with both; a receiver holding either one verifies.
func TestKeyRingSignsWithEveryKey(t *testing.T) {
	t.Parallel()
	secret := webhook.NewSecret()
	private, public := webhook.NewSigningKey()
	ring, err := webhook.ParseKeys(secret, private)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`{}`)
	now := time.Now()
	sig := webhook.Sign(ring, "msg", now, body)
	entries := strings.Fields(sig)
	if len(entries) != 2 || !strings.HasPrefix(entries[0], "v1,") || !strings.HasPrefix(entries[1], "v1a,") {
		t.Fatalf("signature %q: want a v1 and a v1a entry", sig)
	}
	ts := strconv.FormatInt(now.Unix(), 10)
	for _, k := range []string{secret, public, private} {
		keys, err := webhook.ParseKeys(k)
		if err != nil {
			t.Fatal(err)
		}
		if err := webhook.Verify(keys, "msg", ts, sig, body, time.Minute, now); err != nil {
			t.Errorf("key %.8s…: %v", k, err)
		}
	}
	if pk, _ := webhook.ParseKey(private); pk.Public() != public {
		t.Fatalf("Public() = %s, want %s", pk.Public(), public)
	}
}

func TestVerifyRejects(t *testing.T) {
	t.Parallel()
	secret := webhook.NewSecret()
	private, public := webhook.NewSigningKey()
	ring, _ := webhook.ParseKeys(secret, private)
	verifyWith, _ := webhook.ParseKeys(secret, public)
	other, _ := webhook.ParseKeys(webhook.NewSecret())
	body := []byte(`{"a":1}`)
	now := time.Now()
	ts := func(at time.Time) string { return strconv.FormatInt(at.Unix(), 10) }
	good := webhook.Sign(ring, "id", now, body)
	cases := []struct {
		name        string
		keys        []webhook.Key
		id, ts, sig string
		body        []byte
		want        error
	}{
		{"wrong key", other, "id", ts(now), good, body, webhook.ErrBadSignature},
		{"tampered body", verifyWith, "id", ts(now), good, []byte(`{"a":2}`), webhook.ErrBadSignature},
		{"other id", verifyWith, "id2", ts(now), good, body, webhook.ErrBadSignature},
		{"stale", verifyWith, "id", ts(now.Add(-10 * time.Minute)), webhook.Sign(ring, "id", now.Add(-10*time.Minute), body), body, webhook.ErrBadTimestamp},
		{"future", verifyWith, "id", ts(now.Add(10 * time.Minute)), webhook.Sign(ring, "id", now.Add(10*time.Minute), body), body, webhook.ErrBadTimestamp},
		{"garbage timestamp", verifyWith, "id", "yesterday", good, body, webhook.ErrBadTimestamp},
		{"missing signature", verifyWith, "id", ts(now), "", body, webhook.ErrMissingHeaders},
		{"unknown scheme", verifyWith, "id", ts(now), "v2," + strings.TrimPrefix(strings.Fields(good)[0], "v1,"), body, webhook.ErrBadSignature},
		{"v1 entry checked against the public key only", func() []webhook.Key { k, _ := webhook.ParseKeys(public); return k }(), "id", ts(now), strings.Fields(good)[0], body, webhook.ErrBadSignature},
	}
	for _, c := range cases {
		if err := webhook.Verify(c.keys, c.id, c.ts, c.sig, c.body, 5*time.Minute, now); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if err := webhook.Verify(verifyWith, "id", ts(now), good, body, 5*time.Minute, now); err != nil {
		t.Fatalf("the good message: %v", err)
	}
}

func TestParseKeyRejects(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"", "secret", "whsec_!!", "whsec_c2hvcnQ=", "whpk_c2hvcnQ=", "whsk_c2hvcnQ="} {
		if _, err := webhook.ParseKey(k); !errors.Is(err, webhook.ErrInvalidKey) {
			t.Errorf("ParseKey(%q) = %v, want ErrInvalidKey", k, err)
		}
	}
}
