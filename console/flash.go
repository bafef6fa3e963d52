package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"
)

// A flash message (what an action did, or why it failed) goes from the
// action to the page it redirects to in a short-lived cookie the handler
// signs, never in the URL: a link cannot put words in the console's
// banners.

// flashCookie holds the signed flash message.
const flashCookie = "idemq_console_flash"

// flash is a message for the next page: Done (green) or Error (red).
type flash struct{ Done, Error string }

// setFlash signs f for user and sets it in the response.
func (h *handler) setFlash(w http.ResponseWriter, r *http.Request, user string, f flash) {
	payload := base64.RawURLEncoding.EncodeToString([]byte(f.Done + "\x00" + f.Error))
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: payload + "." + h.flashMAC(user, payload), Path: cmpOr(h.cfg.Prefix, "/"),
		HttpOnly: true, Secure: r.TLS != nil, SameSite: http.SameSiteStrictMode, MaxAge: 60})
}

// takeFlash returns the flash message r carries for user, if its
// signature holds, and clears it.
func (h *handler) takeFlash(w http.ResponseWriter, r *http.Request, user string) flash {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return flash{}
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Path: cmpOr(h.cfg.Prefix, "/"), MaxAge: -1, HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode})
	payload, mac, ok := strings.Cut(c.Value, ".")
	if !ok || !hmac.Equal([]byte(mac), []byte(h.flashMAC(user, payload))) {
		return flash{}
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return flash{}
	}
	done, errText, _ := strings.Cut(string(raw), "\x00")
	return flash{Done: done, Error: errText}
}

// flashMAC signs a flash payload for user under the handler's secret.
func (h *handler) flashMAC(user, payload string) string {
	m := hmac.New(sha256.New, h.secret)
	m.Write([]byte("flash\x00" + user + "\x00" + payload))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
