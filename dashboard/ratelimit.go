package dashboard

import (
	"sync"
	"time"
)

// The sign-in limit. A token of 16 characters or more is not guessed by
// trying, but nothing should let anyone try at the speed of the network:
//
//   - each client address may get the token wrong signInFreeFailures times
//     in a row; after that it must wait before its next try, twice as long
//     after each further failure, up to signInMaxBlock. A right token ends
//     the wait's growth;
//   - all addresses together may try signInBurst times at once and
//     signInRate times a second after that, so that many addresses do not
//     make many guessers;
//   - refusals are logged at signInLogBurst lines at once and one per
//     signInLogEvery after that, each line counting those not logged.
const (
	signInFreeFailures = 3
	signInFirstBlock   = time.Second
	signInMaxBlock     = 15 * time.Minute
	signInBurst        = 30
	signInRate         = 1.0 // per second
	signInLogBurst     = 5
	signInLogEvery     = 10 * time.Second
	// signInForgetAfter is how long a client's failures are remembered.
	signInForgetAfter = time.Hour
	// signInTracked bounds the addresses remembered.
	signInTracked = 10_000
)

// tokenBucket is a token bucket on an injected clock.
type tokenBucket struct {
	burst  float64
	perSec float64
	tokens float64
	at     time.Time
}

func newTokenBucket(burst int, perSec float64) tokenBucket {
	return tokenBucket{burst: float64(burst), perSec: perSec, tokens: float64(burst)}
}

func (b *tokenBucket) refill(now time.Time) {
	if !b.at.IsZero() && now.After(b.at) {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.at).Seconds()*b.perSec)
	}
	if b.at.IsZero() || now.After(b.at) {
		b.at = now
	}
}

// take takes a token, or says how long until one is there.
func (b *tokenBucket) take(now time.Time) time.Duration {
	b.refill(now)
	if b.tokens >= 1 {
		b.tokens--
		return 0
	}
	return time.Duration((1 - b.tokens) / b.perSec * float64(time.Second))
}

type addrFailures struct {
	failures     int
	blockedUntil time.Time
	last         time.Time
}

type signInLimiter struct {
	mu         sync.Mutex
	byAddr     map[string]*addrFailures
	overall    tokenBucket
	logs       tokenBucket
	suppressed int
}

func newSignInLimiter() *signInLimiter {
	return &signInLimiter{
		byAddr:  map[string]*addrFailures{},
		overall: newTokenBucket(signInBurst, signInRate),
		logs:    newTokenBucket(signInLogBurst, 1/signInLogEvery.Seconds()),
	}
}

// admit says how long the client must wait before it may try; zero admits
// the try, and counts it against the overall rate.
func (l *signInLimiter) admit(client string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	if a := l.byAddr[client]; a != nil && now.Before(a.blockedUntil) {
		return a.blockedUntil.Sub(now)
	}
	return l.overall.take(now)
}

// failed records a wrong token from client, and says whether to log it and
// how many refusals went unlogged before it.
func (l *signInLimiter) failed(client string, now time.Time) (log bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	a := l.byAddr[client]
	if a == nil {
		l.forgetSome(now)
		a = &addrFailures{}
		l.byAddr[client] = a
	}
	if now.Sub(a.last) > signInForgetAfter {
		a.failures = 0 // an old mistake does not count against today's
	}
	a.failures++
	a.last = now
	if over := a.failures - signInFreeFailures; over > 0 {
		block := signInMaxBlock
		if over < 20 {
			block = min(signInFirstBlock<<(over-1), signInMaxBlock)
		}
		a.blockedUntil = now.Add(block)
	}
	if l.logs.take(now) > 0 {
		l.suppressed++
		return false, 0
	}
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}

// succeeded forgets the client's failures.
func (l *signInLimiter) succeeded(client string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.byAddr, client)
}

// forgetSome makes room for one more address: those no longer blocked go
// first, then the one seen longest ago.
func (l *signInLimiter) forgetSome(now time.Time) {
	if len(l.byAddr) < signInTracked {
		return
	}
	var oldest string
	for k, a := range l.byAddr {
		if now.After(a.blockedUntil.Add(signInMaxBlock)) {
			delete(l.byAddr, k)
		} else if oldest == "" || a.last.Before(l.byAddr[oldest].last) {
			oldest = k
		}
	}
	if len(l.byAddr) >= signInTracked {
		delete(l.byAddr, oldest)
	}
}
