// Package memory is the embedded default backend: every lock lives in the
// agent's process, so it coordinates the applications of one host. It owns
// the lock table and the fencing epoch file of the state directory; it knows
// nothing of sessions, sockets or the wire protocol.
//
// # Expiry
//
// A lease lives for exactly its TTL, counted on Go's monotonic clock from the
// moment the backend applies the acquire or the last renewal: it is dead from
// that instant on, so the RetryIn of a denied acquire is always positive.
// Expiry is checked lazily whenever a name is touched; an expired holder is
// then pruned and the name's watchers are notified. The backend starts no
// goroutine and no timer (it uses only time.Now, a mutex and channels), so it
// runs unchanged inside a testing/synctest bubble.
//
// # Waiters
//
// Each name has a queue of tickets (see backend.AcquireRequest.Ticket),
// pruned like holders when they expire; a watch with a ticket is woken only
// when that ticket may ask.
//
// # Fencing tokens
//
// A token is epoch<<32 | seq. The epoch lives in the file "epoch" of the state
// directory: Open reads it, adds one and writes it back atomically (temporary
// file, fsync, rename, fsync of the directory) before any grant, so every
// token of this run is larger than every token of the runs before. seq is one
// counter shared by every name, which is enough for tokens to increase per
// name; when it runs out, the epoch is bumped and written again first.
// Epochs stay below 2^21, so tokens stay below backend.MaxToken (2^53-1).
//
// The file holds the last epoch used, and only 0 to 2^21-2 leave an epoch
// to move to. Open refuses any other number, however large, with
// backend.ErrTokensExhausted, the error of an acquire once the last epoch
// runs out too. It refuses an unreadable or corrupt epoch file rather than
// start again from zero, which would let tokens go back: restore the file,
// or write into it a number from the last epoch used up to 2^21-2.
// Deleting the file is safe only once no resource remembers a token of
// this agent.
//
// # Memory
//
// A name stays in the table after its last holder leaves, so that Inspect
// still reports its last token. The table is bounded: when a new name would
// grow it past max(65536, twice the names held at the last sweep), it is
// swept first: expired holders are pruned and free names dropped. A dropped
// name's Inspect reports LastToken 0 ("unknown"); its tokens still increase,
// because they do not depend on the table.
package memory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockagent/lockagent/backend"
)

var _ backend.Backend = (*Backend)(nil)

const (
	// epochFile is the name of the fencing epoch file in the state directory.
	epochFile = "epoch"
	// seqBits is the width of the sequence part of a token.
	seqBits = 32
	// seqMax is the last sequence number of an epoch. It stops one short of
	// 2^32-1 so that the last epoch's last token stays below MaxToken.
	seqMax = 1<<seqBits - 2
	// epochLimit is the first epoch that is never used:
	// (epochLimit-1)<<seqBits | seqMax = 2^53-2 < backend.MaxToken.
	epochLimit = 1 << (53 - seqBits)
	// minSweep is the smallest table size that triggers a sweep.
	minSweep = 1 << 16
)

// Backend is the in-process lock store. Its methods are safe for concurrent
// use.
type Backend struct {
	dir string // the state directory, which holds the epoch file

	// mu guards every field below. It is held for the whole of each
	// operation, so an operation is atomic and a notification is sent only
	// after the change it announces.
	mu       sync.Mutex
	closed   bool
	epoch    uint64 // written to the epoch file before any token of it
	seq      uint64 // the last sequence number granted in epoch
	names    map[string]*entry
	sweepAt  int                                 // adding a name to a table of this size sweeps it first
	minSweep int                                 // the floor of sweepAt: minSweep, lowered by tests
	watchers map[string]map[chan struct{}]string // name -> channel -> its ticket
}

// entry is the state of one name.
type entry struct {
	// holders maps lease ids to holders: one exclusive holder, or any number
	// of shared ones. It may hold expired holders until the next prune.
	holders   map[string]*holder
	lastToken uint64
	// queue is the waiters' tickets in order of arrival. It may hold
	// expired tickets until the next prune.
	queue []*ticket
}

// ticket is one waiter's place in a name's queue.
type ticket struct {
	id      string
	mode    backend.Mode
	expires time.Time // monotonic; it leaves the queue at this instant
}

// holder is one lease on a name.
type holder struct {
	mode    backend.Mode
	token   uint64
	meta    string
	host    string
	expires time.Time // monotonic; the holder is dead from this instant on
}

// Open returns a backend whose fencing epoch lives in stateDir, created with
// mode 0700 if missing. It bumps and persists the epoch before returning.
func Open(stateDir string) (*Backend, error) {
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("memory: create state directory: %w", err)
	}
	epoch, err := readEpoch(stateDir)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		dir:      stateDir,
		epoch:    epoch,
		names:    make(map[string]*entry),
		sweepAt:  minSweep,
		minSweep: minSweep,
		watchers: make(map[string]map[chan struct{}]string),
	}
	if err := b.nextEpoch(); err != nil {
		return nil, err
	}
	return b, nil
}

// Name returns "memory".
func (b *Backend) Name() string { return "memory" }

// Acquire makes one attempt at req.
func (b *Backend) Acquire(ctx context.Context, req backend.AcquireRequest) (backend.Grant, error) {
	if err := req.Validate(); err != nil {
		return backend.Grant{}, fmt.Errorf("memory: %w", err)
	}
	if err := b.lock(ctx); err != nil {
		return backend.Grant{}, fmt.Errorf("memory: acquire %q: %w", req.Name, err)
	}
	defer b.mu.Unlock()
	now := time.Now()
	for _, l := range req.Releases {
		if e, h := b.holder(l, now); h != nil {
			delete(e.holders, l.LeaseID)
			b.notify(l.Name, e)
		}
	}
	e := b.names[req.Name]
	if e != nil {
		b.prune(req.Name, e, now)
		if h := e.holders[req.LeaseID]; h != nil {
			if h.mode != req.Mode {
				return backend.Grant{}, fmt.Errorf("memory: acquire %q: %w", req.Name, backend.ErrOtherMode)
			}
			h.expires = now.Add(req.TTL)
			return backend.Grant{Token: h.token}, nil
		}
		ahead, retryIn, ok := e.mayAsk(req, now)
		if !ok {
			return backend.Grant{}, &backend.HeldError{RetryIn: retryIn}
		}
		if retryIn, denied := e.conflict(req, ahead, now); denied {
			e.enqueue(req, now)
			return backend.Grant{}, &backend.HeldError{RetryIn: retryIn}
		}
		e.dequeue(req.Ticket)
	}
	token, err := b.nextToken()
	if err != nil {
		return backend.Grant{}, fmt.Errorf("memory: acquire %q: %w", req.Name, err)
	}
	if e == nil {
		e = b.add(req.Name, now)
	}
	e.holders[req.LeaseID] = &holder{
		mode:    req.Mode,
		token:   token,
		meta:    req.Meta,
		host:    req.Host,
		expires: now.Add(req.TTL),
	}
	e.lastToken = token
	return backend.Grant{Token: token}, nil
}

// Renew extends each live lease of reqs by its TTL from now. An expired lease
// is never renewed: it gets ErrNotHeld.
func (b *Backend) Renew(ctx context.Context, reqs []backend.RenewRequest) []error {
	errs := make([]error, len(reqs))
	if err := b.lock(ctx); err != nil {
		for i, r := range reqs {
			errs[i] = fmt.Errorf("memory: renew %q: %w", r.Name, err)
		}
		return errs
	}
	defer b.mu.Unlock()
	now := time.Now()
	for i, r := range reqs {
		switch e, h := b.holder(r.LeaseKey, now); {
		case r.TTL <= 0:
			errs[i] = fmt.Errorf("memory: renew %q: ttl %v is not positive", r.Name, r.TTL)
		case h == nil && e != nil && conflicts(e, r.Mode):
			errs[i] = fmt.Errorf("memory: renew %q: %w", r.Name, backend.ErrTakenOver)
		case h == nil:
			errs[i] = fmt.Errorf("memory: renew %q: %w", r.Name, backend.ErrNotHeld)
		default:
			h.expires = now.Add(r.TTL)
		}
	}
	return errs
}

// Local is true: the agent's calls are function calls (see backend.Local).
func (b *Backend) Local() bool { return true }

// Release ends the lease l and notifies the watchers of its name.
func (b *Backend) Release(ctx context.Context, l backend.LeaseKey) error {
	if err := b.lock(ctx); err != nil {
		return fmt.Errorf("memory: release %q: %w", l.Name, err)
	}
	defer b.mu.Unlock()
	e, h := b.holder(l, time.Now())
	if h == nil {
		return fmt.Errorf("memory: release %q: %w", l.Name, backend.ErrNotHeld)
	}
	delete(e.holders, l.LeaseID)
	b.notify(l.Name, e)
	return nil
}

// Leave takes ticket out of name's queue, and wakes the waiters that may
// ask once it is gone.
func (b *Backend) Leave(ctx context.Context, name, id string) error {
	if err := b.lock(ctx); err != nil {
		return fmt.Errorf("memory: leave %q: %w", name, err)
	}
	defer b.mu.Unlock()
	e := b.names[name]
	if e == nil {
		return nil
	}
	b.prune(name, e, time.Now())
	i, g := e.index(id), e.headGroup()
	e.dequeue(id)
	if i >= 0 && i <= g+1 {
		// The head may have changed: the next waiters may ask now.
		b.notify(name, e)
	}
	return nil
}

// Inspect reports the live holders of name, sorted by token, and its last
// token (0 for a name never locked or dropped by a sweep).
func (b *Backend) Inspect(ctx context.Context, name string) (backend.LockInfo, error) {
	if err := b.lock(ctx); err != nil {
		return backend.LockInfo{}, fmt.Errorf("memory: inspect %q: %w", name, err)
	}
	defer b.mu.Unlock()
	info := backend.LockInfo{Holders: []backend.Holder{}}
	e := b.names[name]
	if e == nil {
		return info, nil
	}
	now := time.Now()
	b.prune(name, e, now)
	for id, h := range e.holders {
		info.Holders = append(info.Holders, backend.Holder{
			LeaseID:   id,
			Mode:      h.mode,
			Token:     h.token,
			Meta:      h.meta,
			Host:      h.host,
			ExpiresIn: h.expires.Sub(now),
		})
	}
	slices.SortFunc(info.Holders, func(x, y backend.Holder) int { return cmp.Compare(x.Token, y.Token) })
	info.LastToken = e.lastToken
	info.Queued = len(e.queue)
	return info, nil
}

// Watch returns a channel that receives a value (coalesced) whenever a lease
// on name is released or found expired, or the queue ahead of ticket
// changes, while ticket may ask (see backend.Backend), and a function, safe
// to call more than once, that ends the watch. ctx bounds only the call:
// the watch lasts until it is ended. Close wakes every watcher, so that
// waiters retry and see ErrClosed.
func (b *Backend) Watch(ctx context.Context, name, ticket string) (<-chan struct{}, func(), error) {
	if err := b.lock(ctx); err != nil {
		return nil, nil, fmt.Errorf("memory: watch %q: %w", name, err)
	}
	defer b.mu.Unlock()
	ch := make(chan struct{}, 1)
	if b.watchers[name] == nil {
		b.watchers[name] = make(map[chan struct{}]string)
	}
	b.watchers[name][ch] = ticket
	cancel := func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.watchers[name], ch)
		if len(b.watchers[name]) == 0 {
			delete(b.watchers, name)
		}
	}
	return ch, cancel, nil
}

// Close drops every lock and wakes every watcher. Later calls, Close
// included, return ErrClosed. The epoch file stays: the next Open bumps it.
func (b *Backend) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return fmt.Errorf("memory: close: %w", backend.ErrClosed)
	}
	b.closed = true
	for name := range b.watchers {
		b.notify(name, nil)
	}
	b.names, b.watchers = nil, nil
	return nil
}

// lock checks ctx and takes b.mu. When it returns nil, the caller must
// unlock b.mu.
func (b *Backend) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return backend.ErrClosed
	}
	return nil
}

// holder returns the entry of l's name, after pruning it, and the live holder
// of l, or nil when l's lease id does not hold the name in l's mode.
func (b *Backend) holder(l backend.LeaseKey, now time.Time) (*entry, *holder) {
	e := b.names[l.Name]
	if e == nil {
		return nil, nil
	}
	b.prune(l.Name, e, now)
	h := e.holders[l.LeaseID]
	if h == nil || h.mode != l.Mode {
		return e, nil
	}
	return e, h
}

// conflicts tells whether e has a live (pruned) holder that a lease of
// mode could not be held beside: then a lease of that mode that is gone was
// taken over.
func conflicts(e *entry, mode backend.Mode) bool {
	for _, h := range e.holders {
		if mode == backend.Exclusive || h.mode == backend.Exclusive {
			return true
		}
	}
	return false
}

// prune removes the holders and tickets of e that are dead at now and, if
// there were any, notifies the watchers of name.
func (b *Backend) prune(name string, e *entry, now time.Time) {
	pruned := false
	for id, h := range e.holders {
		if !now.Before(h.expires) {
			delete(e.holders, id)
			pruned = true
		}
	}
	n := len(e.queue)
	e.queue = slices.DeleteFunc(e.queue, func(t *ticket) bool { return !now.Before(t.expires) })
	if pruned || len(e.queue) < n {
		b.notify(name, e)
	}
}

// notify wakes, without blocking, the watchers of name that may ask now:
// those without a ticket, and those whose ticket is at the head of e's
// queue (every watcher when e is nil or its queue empty). A watcher whose
// channel is full already has a wake-up pending.
func (b *Backend) notify(name string, e *entry) {
	var head []*ticket
	if e != nil && len(e.queue) > 0 {
		head = e.queue[:e.headGroup()+1]
	}
	for ch, tk := range b.watchers[name] {
		if tk != "" && len(head) > 0 && !slices.ContainsFunc(head, func(t *ticket) bool { return t.id == tk }) {
			continue
		}
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// headGroup is the index of the last ticket of the head of the queue: the
// first ticket, and every shared one after a shared first. -1 when the
// queue is empty.
func (e *entry) headGroup() int {
	switch {
	case len(e.queue) == 0:
		return -1
	case e.queue[0].mode == backend.Exclusive:
		return 0
	}
	i := 0
	for i+1 < len(e.queue) && e.queue[i+1].mode == backend.Shared {
		i++
	}
	return i
}

// index is the position of ticket in the queue, -1 if it is not there.
func (e *entry) index(id string) int {
	if id == "" {
		return -1
	}
	return slices.IndexFunc(e.queue, func(t *ticket) bool { return t.id == id })
}

// mayAsk tells whether req may be granted as far as the queue goes: a try
// only when nobody queues, a waiter when its ticket is at the head (see
// headGroup) or the queue is empty; with the tickets of the head ahead of
// it (see conflict). A waiter that may not ask joins the queue (or renews
// its place); the retry hint is when the head ticket expires if nobody
// renews it.
func (e *entry) mayAsk(req backend.AcquireRequest, now time.Time) (ahead int, retryIn time.Duration, ok bool) {
	if len(e.queue) == 0 {
		return 0, 0, true
	}
	if i := e.index(req.Ticket); i >= 0 && i <= e.headGroup() {
		return i, 0, true
	}
	if req.Ticket != "" {
		e.enqueue(req, now)
	}
	return 0, e.headExpires(now), false
}

// headExpires is how long until the head ticket expires if nobody renews
// it. The queue is not empty.
func (e *entry) headExpires(now time.Time) time.Duration {
	return max(e.queue[0].expires.Sub(now), time.Nanosecond)
}

// enqueue puts req's ticket at the tail of the queue, or renews its place
// there.
func (e *entry) enqueue(req backend.AcquireRequest, now time.Time) {
	if req.Ticket == "" {
		return
	}
	if i := e.index(req.Ticket); i >= 0 {
		e.queue[i].expires = now.Add(min(req.TTL, backend.TicketLife))
		return
	}
	e.queue = append(e.queue, &ticket{id: req.Ticket, mode: req.Mode, expires: now.Add(min(req.TTL, backend.TicketLife))})
}

// dequeue takes a ticket out of the queue.
func (e *entry) dequeue(id string) {
	if i := e.index(id); i >= 0 {
		e.queue = slices.Delete(e.queue, i, i+1)
	}
}

// add puts a new entry for name in the table, sweeping the table first when
// it has grown to b.sweepAt.
func (b *Backend) add(name string, now time.Time) *entry {
	if len(b.names) >= b.sweepAt {
		for n, e := range b.names {
			b.prune(n, e, now)
			if len(e.holders) == 0 && len(e.queue) == 0 {
				delete(b.names, n)
			}
		}
		// Doubling keeps the cost of sweeps constant per added name.
		b.sweepAt = max(b.minSweep, 2*len(b.names))
	}
	e := &entry{holders: make(map[string]*holder)}
	b.names[name] = e
	return e
}

// conflict reports whether the live holders of e deny req, and if so how
// long until they would stop denying it if nobody renewed: when the last of
// them expires for a conflict of modes, when the first one expires for a
// full semaphore. A shared request with a limit counts the shared tickets
// ahead of it at the head of the queue (ahead) as holders: they came first,
// and the places the limit leaves are theirs first.
func (e *entry) conflict(req backend.AcquireRequest, ahead int, now time.Time) (time.Duration, bool) {
	if len(e.holders) == 0 {
		if req.Limit > 0 && ahead >= req.Limit {
			return e.headExpires(now), true
		}
		return 0, false
	}
	var first, last time.Time
	exclusive := false
	for _, h := range e.holders {
		exclusive = exclusive || h.mode == backend.Exclusive
		if first.IsZero() || h.expires.Before(first) {
			first = h.expires
		}
		if h.expires.After(last) {
			last = h.expires
		}
	}
	switch {
	case exclusive || req.Mode == backend.Exclusive:
		return last.Sub(now), true
	case req.Limit > 0 && len(e.holders)+ahead >= req.Limit:
		return first.Sub(now), true
	}
	return 0, false
}

// nextToken returns a token larger than every token granted before, moving
// to a new epoch when the sequence runs out.
func (b *Backend) nextToken() (uint64, error) {
	if b.seq == seqMax {
		if err := b.nextEpoch(); err != nil {
			return 0, err
		}
	}
	b.seq++
	return b.epoch<<seqBits | b.seq, nil
}

// nextEpoch persists the epoch after b.epoch and then moves to it. It is
// the one check of an epoch's range: b.epoch is the number the epoch file
// held at Open, and later the epoch whose sequence ran out, and only an
// epoch below epochLimit-1 has another after it. It checks before it adds,
// so that no number wraps around.
func (b *Backend) nextEpoch() error {
	path := filepath.Join(b.dir, epochFile)
	if b.epoch >= epochLimit-1 {
		return fmt.Errorf("memory: fencing epoch file %s: %w: it must hold a number from 0 to %d, "+
			"the last epoch used, for another epoch to follow (tokens stay below 2^53): restore it, or delete it, "+
			"but only once no resource remembers a token of this agent", path, backend.ErrTokensExhausted, epochLimit-2)
	}
	next := b.epoch + 1
	if err := writeEpoch(b.dir, next); err != nil {
		return err
	}
	b.epoch, b.seq = next, 0
	return nil
}

// readEpoch returns the epoch stored in dir, 0 if there is none yet. A
// decimal number too large for 64 bits reads as the largest uint64 (what
// strconv.ParseUint returns with ErrRange), for nextEpoch to refuse like
// any other number past the range.
func readEpoch(dir string) (uint64, error) {
	path := filepath.Join(dir, epochFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("memory: read fencing epoch: %w", err)
	}
	text := strings.TrimSuffix(string(data), "\n")
	epoch, err := strconv.ParseUint(text, 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		// %.32q: the file may be large; its start says enough.
		return 0, fmt.Errorf("memory: fencing epoch file %s is corrupt: it holds %.32q, not a decimal number: "+
			"restore it, or write into it a number from the last epoch used up to %d; "+
			"deleting it would let fencing tokens go back", path, text, epochLimit-2)
	}
	return epoch, nil
}

// writeEpoch replaces the epoch file of dir atomically and durably: a
// temporary file in the same directory, fsync, rename, fsync of the
// directory. A crash leaves either the old epoch or the new one.
func writeEpoch(dir string, epoch uint64) error {
	f, err := os.CreateTemp(dir, epochFile+".tmp*")
	if err != nil {
		return fmt.Errorf("memory: write fencing epoch: %w", err)
	}
	_, err = fmt.Fprintf(f, "%d\n", epoch)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, epochFile))
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("memory: write fencing epoch: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("memory: write fencing epoch: %w", err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("memory: write fencing epoch: sync %s: %w", dir, err)
	}
	return nil
}
