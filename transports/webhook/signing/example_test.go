package signing_test

import (
	"fmt"
	"strconv"
	"time"

	"github.com/idemq/idemq/transports/webhook/signing"
)

// ExampleVerify checks a webhook by hand, for a receiver that does not use
// webhook.Receiver: here with the public half of an ed25519 key while the
// sender signs with an HMAC secret and the private half.
func ExampleVerify() {
	secret := signing.NewSecret()
	private, public := signing.NewSigningKey()
	ring, _ := signing.ParseKeys(secret, private) // the sender's key ring
	body := []byte(`{"type":"invoice.paid","timestamp":"2026-11-23T18:00:00Z","data":{}}`)
	now := time.Now()
	signature := signing.Sign(ring, "msg_1", now, body)

	keys, _ := signing.ParseKeys(public) // all the receiver holds
	ts := strconv.FormatInt(now.Unix(), 10)
	fmt.Println(signing.Verify(keys, "msg_1", ts, signature, body, 5*time.Minute, now))
	fmt.Println(signing.Verify(keys, "msg_1", ts, signature, append(body, ' '), 5*time.Minute, now))
	// Output:
	// <nil>
	// webhook: no signature matches
}
