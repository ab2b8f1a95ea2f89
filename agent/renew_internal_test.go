package agent

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/lockagent/lockagent/backend/memory"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// events is a Conn that keeps the events it is sent.
type events struct {
	mu  sync.Mutex
	got []Event
}

func (e *events) Send(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, ev)
}
func (e *events) Close() {}
func (e *events) Written() <-chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// TestRenewalAnsweredAfterTheDeadline: a renewal the backend applied, but
// whose answer is read after the lease's local deadline, loses the lease
// (the backend may have let it go meanwhile); it never extends it. The
// scheduler, which would lose the lease at its deadline, does not run
// here: the answer is read first, as when the scheduler is starved.
func TestRenewalAnsweredAfterTheDeadline(t *testing.T) {
	mb, err := memory.Open(filepath.Join(t.TempDir(), "state"))
	require.NoError(t, err)
	defer mb.Close()
	a := New(Config{Backend: mb})
	conn := &events{}
	s, err := a.Open(Peer{}, SessionOptions{}, conn)
	require.NoError(t, err)
	const ttl = 2 * time.Second
	res, err := s.Acquire(context.Background(), AcquireRequest{Name: "n", TTL: ttl})
	require.NoError(t, err)
	require.True(t, res.Acquired)

	a.mu.Lock()
	l := a.leases[res.Lease.ID]
	require.NotNil(t, l)
	l.validUntil = time.Now() // its local deadline, reached
	l.renewing = true
	a.mu.Unlock()
	a.renew(context.Background(), []*lease{l}, time.Now().Add(ttl))

	a.mu.Lock()
	_, held := a.leases[l.id]
	a.mu.Unlock()
	assert.False(t, held, "the lease was extended past its local deadline")
	conn.mu.Lock()
	defer conn.mu.Unlock()
	require.Len(t, conn.got, 1)
	assert.Equal(t, EventLost, conn.got[0].Kind)
	assert.Equal(t, ReasonBackendUnavailable, conn.got[0].Reason)
	a.wg.Wait() // the background release
}
