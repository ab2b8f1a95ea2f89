package socketapi_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/lockagent/lockagent/backend"
)

// TestGrantComesBeforeItsEvents: while an admin breaks a name in a loop, a
// client acquiring it never sees a lost event for a lease it was not
// granted yet.
func TestGrantComesBeforeItsEvents(t *testing.T) {
	ta := startAgent(t)
	adm, a := ta.raw(t), ta.raw(t)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			adm.send(`{"op":"break","name":"x"}`)
			adm.recv()
		}
	}()
	known := map[any]bool{}
	for i := 0; i < 1000; i++ {
		a.send(fmt.Sprintf(`{"id":%d,"op":"acquire","name":"x","wait_ms":50}`, i))
		for {
			m := a.recv()
			if m["event"] == "lost" {
				require.True(t, known[m["lease"]], "round %d: lost for lease %v before its grant", i, m["lease"])
				continue
			}
			if m["lease"] != nil {
				known[m["lease"]] = true
			}
			if m["id"] == float64(i) {
				break
			}
		}
	}
	close(stop)
	<-done
}

// slowAcquire delays the backend's acquires, and says when one started.
type slowAcquire struct {
	backend.Backend
	delay   atomic.Int64
	started chan struct{}
}

func (s *slowAcquire) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Grant, error) {
	select {
	case s.started <- struct{}{}:
	default:
	}
	time.Sleep(time.Duration(s.delay.Load()))
	return s.Backend.Acquire(ctx, req)
}

// TestResumeEndsTheOldConnectionsRequests: a try in flight on a connection
// whose session another connection resumes is not granted to anybody.
func TestResumeEndsTheOldConnectionsRequests(t *testing.T) {
	sb := &slowAcquire{started: make(chan struct{}, 1)}
	ta := startAgent(t, func(o *options) { sb.Backend = o.Agent.Backend; o.Agent.Backend = sb })
	a := ta.raw(t)
	h := a.ok(`{"id":1,"op":"hello","session_ttl_ms":60000}`)
	sb.delay.Store(int64(300 * time.Millisecond))
	a.send(`{"id":2,"op":"acquire","name":"x"}`)
	<-sb.started // the try is in the backend
	b := ta.raw(t)
	b.ok(fmt.Sprintf(`{"id":1,"op":"hello","resume":{"session":%q,"token":%q}}`, h["session"], h["resume_token"]))
	sb.delay.Store(0)
	a.requireClosed()
	other := ta.raw(t)
	require.Eventually(t, func() bool {
		return other.ok(`{"op":"acquire","name":"x"}`)["acquired"] == true
	}, 2*time.Second, 5*time.Millisecond, "the orphan grant was released")
	for _, s := range b.ok(`{"op":"list"}`)["sessions"].([]any) {
		if s := s.(map[string]any); s["session"] == h["session"] {
			assert.Empty(t, s["leases"], "the resumed session got no lease")
		}
	}
}

// TestOldConnectionStopsAfterResume: lines the old connection sends after
// another one resumed its session are not acted upon.
func TestOldConnectionStopsAfterResume(t *testing.T) {
	ta := startAgent(t)
	a := ta.raw(t)
	h := a.ok(`{"id":1,"op":"hello","session_ttl_ms":60000}`)
	b := ta.raw(t)
	b.ok(fmt.Sprintf(`{"id":1,"op":"hello","resume":{"session":%q,"token":%q}}`, h["session"], h["resume_token"]))
	a.nc.Write([]byte(`{"id":3,"op":"bye"}` + "\n")) // may fail: a is closed
	a.requireClosed()
	assert.Equal(t, true, b.ok(`{"op":"acquire","name":"zz"}`)["acquired"], "the session lives on")
}

// TestCancelThenReuseTheID: an id reused right after its cancel names the
// new request.
func TestCancelThenReuseTheID(t *testing.T) {
	ta := startAgent(t)
	ta.raw(t).ok(`{"op":"acquire","name":"c"}`)
	for i := 0; i < 100; i++ {
		b := ta.raw(t)
		b.send(`{"id":5,"op":"acquire","name":"c","wait_ms":-1}`)
		b.send(`{"id":6,"op":"cancel","target":5}`)
		b.send(`{"id":5,"op":"acquire","name":"c","wait_ms":-1}`)
		b.send(`{"id":7,"op":"cancel","target":5}`)
		var last string
		for j := 0; j < 4; j++ {
			b.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			line, err := b.r.ReadString('\n')
			require.NoError(t, err)
			if strings.HasPrefix(line, `{"id":7,`) {
				last = line
			}
		}
		require.Contains(t, last, `"canceled":true`, "round %d", i)
		b.nc.Close()
	}
}

// slowRelease makes the backend's releases hang, as a backend that does
// not answer would.
type slowRelease struct {
	backend.Backend
	hang    atomic.Bool
	unblock chan struct{}
}

func (s *slowRelease) Release(ctx context.Context, l backend.LeaseKey) error {
	if s.hang.Load() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.unblock:
		}
	}
	return s.Backend.Release(ctx, l)
}

// TestDroppedConnectionClosesBeforeTheRelease: a connection dropped for a
// missed heartbeat is closed at once, even when the backend does not answer
// the release: its end is the application's notice that its locks are gone.
func TestDroppedConnectionClosesBeforeTheRelease(t *testing.T) {
	sb := &slowRelease{unblock: make(chan struct{})}
	ta := startAgent(t, func(o *options) { sb.Backend = o.Agent.Backend; o.Agent.Backend = sb })
	r := ta.raw(t)
	r.ok(`{"op":"hello","heartbeat_ms":200}`)
	r.ok(`{"op":"acquire","name":"hb"}`)
	sb.hang.Store(true)
	silent := time.Now()
	r.requireClosed()
	assert.Less(t, time.Since(silent), 2*time.Second, "closed at the heartbeat, not after the release gave up")
	close(sb.unblock)
}
