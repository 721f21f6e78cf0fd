package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// csrfField is the form field that carries the CSRF token.
const csrfField = "csrf"

// tokenLife is how long a form's CSRF token is accepted after the page
// holding it was rendered.
const tokenLife = 12 * time.Hour

// guard authenticates requests and makes and checks CSRF tokens.
type guard struct {
	// userHash and passwordHash are the SHA-256 of the credentials: the
	// comparison then takes the same time whatever the lengths.
	userHash, passwordHash [sha256.Size]byte
	authorize              func(r *http.Request) (string, bool)
	csrfKey                []byte
}

// newGuard returns the guard of credentials auth ("user:password") or of
// the host's authorize, signing tokens with csrfKey (derived from auth when
// nil, random when neither is given).
func newGuard(auth string, authorize func(*http.Request) (string, bool), csrfKey []byte) (*guard, error) {
	g := &guard{authorize: authorize, csrfKey: csrfKey}
	if auth != "" {
		if err := ParseAuth(auth); err != nil {
			return nil, err
		}
		user, password, _ := strings.Cut(auth, ":")
		g.userHash, g.passwordHash = sha256.Sum256([]byte(user)), sha256.Sum256([]byte(password))
		if g.csrfKey == nil {
			// Every process given the same credentials signs alike, so a
			// form rendered by one replica posts to another.
			k := sha256.Sum256([]byte("onceonly console csrf\x00" + auth))
			g.csrfKey = k[:]
		}
	}
	if g.csrfKey == nil {
		g.csrfKey = make([]byte, 32)
		if _, err := rand.Read(g.csrfKey); err != nil {
			return nil, errors.New("console: no randomness for the CSRF key")
		}
	}
	return g, nil
}

// authenticate returns the user r acts as, or false: HTTP Basic credentials
// compared in constant time, or the host's Authorize.
func (g *guard) authenticate(r *http.Request) (string, bool) {
	if g.authorize != nil {
		return g.authorize(r)
	}
	user, password, ok := r.BasicAuth()
	if !ok {
		return "", false
	}
	uh, ph := sha256.Sum256([]byte(user)), sha256.Sum256([]byte(password))
	// Both comparisons run, whichever fails.
	match := subtle.ConstantTimeCompare(uh[:], g.userHash[:]) & subtle.ConstantTimeCompare(ph[:], g.passwordHash[:])
	return user, match == 1
}

// token returns a CSRF token for user's forms, good until tokenLife after
// now: "<expiry unix seconds>.<HMAC-SHA256 of user and expiry>". It needs
// no server state, so any process holding the key checks it.
func (g *guard) token(user string, now time.Time) string {
	expiry := strconv.FormatInt(now.Add(tokenLife).Unix(), 10)
	return expiry + "." + g.sign(user, expiry)
}

// validToken reports whether token is one token made for user and not yet
// expired at now.
func (g *guard) validToken(token, user string, now time.Time) bool {
	expiry, mac, ok := strings.Cut(token, ".")
	if !ok {
		return false
	}
	unix, err := strconv.ParseInt(expiry, 10, 64)
	if err != nil || now.Unix() > unix {
		return false
	}
	return hmac.Equal([]byte(mac), []byte(g.sign(user, expiry)))
}

func (g *guard) sign(user, expiry string) string {
	m := hmac.New(sha256.New, g.csrfKey)
	m.Write([]byte("csrf\x00" + user + "\x00" + expiry))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}
