// Package signing signs and verifies Standard Webhooks
// (https://www.standardwebhooks.com): the key formats, the
// webhook-signature header over "id.timestamp.body", and its constant-time
// check. It has no state, no database and no network: the Sink of package
// webhook signs with it, the Receiver verifies with it, and a program that
// receives webhooks without idemq's Receiver (or tests one) can use it on
// its own.
//
// Keys come serialised with a prefix that names the scheme:
//
//	whsec_<base64>  HMAC-SHA256 secret, scheme "v1": signs and verifies
//	whsk_<base64>   ed25519 private key, scheme "v1a": signs (and verifies)
//	whpk_<base64>   ed25519 public key, scheme "v1a": verifies only
//
// A sender signs with every key of its ring ([Sign]), so during a rotation
// a receiver that holds either the old or the new key verifies the message
// ([Verify]).
//
// The package is named for what it does, so that it imports beside
// net/http and package webhook without an alias.
package signing
