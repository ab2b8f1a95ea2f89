package etcd

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockagent/lockagent/backend"
)

// The keys of a name N, under the key prefix P (see the package doc):
//
//	P/n/E/f/O         a fence: O (19 digits) is a token offset, 0 unless
//	                  an operator set a higher one; the highest is the
//	                  name's, which every grant writes, so that its mod
//	                  revision is the last grant's; the value is empty
//	P/n/E/k/h/x/ID    the exclusive holder: lease id ID; its create
//	                  revision is the grant's; attached to the agent's
//	                  etcd lease of its TTL
//	P/n/E/k/h/s/ID    a shared holder granted without a limit, the same
//	P/n/E/k/h/l/N     a shared holder granted under a limit: slot N (19
//	                  digits, below the limit), its lease id in its value
//	P/n/E/k/q/x/T     an exclusive waiter's ticket T; its create revision
//	                  is its place in the queue; attached to an etcd lease
//	                  of its own
//	P/n/E/k/q/s/T     a shared waiter's ticket, the same
//	P/g/L/E/ID        a holder of etcd lease L (hexadecimal) that another
//	                  agent broke: attached to L, so it goes with it
//
// E is N with "%" and "/" escaped, so that no name's keys are another's.

// escape is a name as one key segment: "%" is "%25" and "/" is "%2F",
// so that no name's directory holds another's.
func escape(name string) string {
	if !strings.ContainsAny(name, "%/") {
		return name
	}
	return strings.NewReplacer("%", "%25", "/", "%2F").Replace(name)
}

// unescape undoes escape.
func unescape(seg string) string {
	if !strings.Contains(seg, "%") {
		return seg
	}
	return strings.NewReplacer("%2F", "/", "%25", "%").Replace(seg)
}

// keys are the keys of one name.
type keys struct {
	dir    string // P/n/E/: every key of the name
	fences string // P/n/E/f/
	lock   string // P/n/E/k/: holders and tickets, what a grant depends on
}

func (b *Backend) keys(name string) keys {
	dir := b.prefix + "n/" + escape(name) + "/"
	return keys{dir: dir, fences: dir + "f/", lock: dir + "k/"}
}

// fence is the key of the fence of offset o; fences sort as numbers.
func (k keys) fence(o uint64) string { return fmt.Sprintf("%s%019d", k.fences, o) }

// The directories of the holders (the exclusive one, the shared ones
// without a limit and under one, in slots) and of the tickets.
func (k keys) holders() string   { return k.lock + "h/" }
func (k keys) exclusive() string { return k.lock + "h/x/" }
func (k keys) shared() string    { return k.lock + "h/s/" }
func (k keys) slots() string     { return k.lock + "h/l/" }
func (k keys) queue() string     { return k.lock + "q/" }

// tickets is the directory of the tickets of mode m.
func (k keys) tickets(m backend.Mode) string {
	if m == backend.Shared {
		return k.lock + "q/s/"
	}
	return k.lock + "q/x/"
}

func (k keys) ticket(m backend.Mode, id string) string { return k.tickets(m) + id }

// slot is the key of slot n; slots sort as numbers.
func (k keys) slot(n int64) string { return fmt.Sprintf("%s%019d", k.slots(), n) }

// markerDir is the directory of the markers of the holders of etcd lease
// id that other agents broke.
func (b *Backend) markerDir(id clientv3.LeaseID) string {
	return b.prefix + "g/" + strconv.FormatInt(int64(id), 16) + "/"
}

func (b *Backend) marker(id clientv3.LeaseID, name, leaseID string) string {
	return b.markerDir(id) + escape(name) + "/" + leaseID
}

// holderValue is a holder key's value. Lockagent writes the field
// "lockagent": a value without it is not lockagent's.
type holderValue struct {
	Version int `json:"lockagent"`
	// ID is the lease id of a holder in a slot (the others have it in
	// their key).
	ID string `json:"id,omitempty"`
	// Offset is the name's token offset when it was granted: its token is
	// its key's create revision plus Offset.
	Offset uint64 `json:"offset,omitempty"`
	TTL    int64  `json:"ttl_ms"` // the lease's TTL, for RetryIn
	Host   string `json:"host,omitempty"`
	Meta   string `json:"meta,omitempty"`
}

// ticketValue is a ticket key's value.
type ticketValue struct {
	Version int   `json:"lockagent"`
	Life    int64 `json:"life_ms"` // how long it lives after an attempt
}

const valueVersion = 1

func encode(v any) string {
	b, _ := json.Marshal(v) // plain structs of strings and numbers
	return string(b)
}

// holder is a holder key as read.
type holder struct {
	key    string
	id     string
	mode   backend.Mode
	slot   int64 // -1 but for a holder in a slot
	v      holderValue
	create int64 // the grant's revision
	mod    int64
	lease  clientv3.LeaseID
}

func (h holder) token() uint64 { return uint64(h.create) + h.v.Offset }
func (h holder) ttl() time.Duration {
	return time.Duration(h.v.TTL) * time.Millisecond
}

// ticket is a ticket key as read.
type ticket struct {
	id     string
	mode   backend.Mode
	life   time.Duration
	create int64 // its place in the queue
	lease  clientv3.LeaseID
}

// fence is the name's fence as read: its offset and its mod revision (0:
// none, and the offset is 0).
type fence struct {
	mod    int64
	offset uint64
}

// state is a name's keys at one revision.
type state struct {
	// rev is the revision of the read; 0 for a guess (see Backend.guess),
	// which assumes no holder and no ticket.
	rev     int64
	fence   fence
	holders []holder
	queue   []ticket // in order of arrival
}

// parse reads a name's keys (every key of k.dir, at rev). A key that
// lockagent did not write is an ErrForeignKey naming it.
func (k keys) parse(kvs []*mvccpb.KeyValue, rev int64) (state, error) {
	st := state{rev: rev}
	for _, kv := range kvs {
		key := string(kv.Key)
		rest, _ := strings.CutPrefix(key, k.dir)
		switch {
		case strings.HasPrefix(rest, "f/"):
			off, err := strconv.ParseUint(rest[2:], 10, 64)
			if err != nil || len(rest) != 21 {
				return state{}, foreign(key)
			}
			if kv.ModRevision != 0 && off >= st.fence.offset {
				st.fence = fence{mod: kv.ModRevision, offset: off}
			}
		case len(rest) > 6 && strings.HasPrefix(rest, "k/h/") && strings.IndexByte("xsl", rest[4]) >= 0 && rest[5] == '/':
			var v holderValue
			if json.Unmarshal(kv.Value, &v) != nil || v.Version != valueVersion {
				return state{}, foreign(key)
			}
			h := holder{key: key, id: rest[6:], mode: backend.Shared, slot: -1, v: v, create: kv.CreateRevision, mod: kv.ModRevision, lease: clientv3.LeaseID(kv.Lease)}
			switch rest[4] {
			case 'x':
				h.mode = backend.Exclusive
			case 'l':
				n, err := strconv.ParseInt(rest[6:], 10, 64)
				if err != nil || n < 0 || v.ID == "" || len(rest[6:]) != 19 {
					return state{}, foreign(key)
				}
				h.id, h.slot = v.ID, n
			}
			st.holders = append(st.holders, h)
		case len(rest) > 6 && (strings.HasPrefix(rest, "k/q/x/") || strings.HasPrefix(rest, "k/q/s/")):
			t, ok := k.parseTicket(kv)
			if !ok {
				return state{}, foreign(key)
			}
			st.queue = append(st.queue, t)
		default:
			return state{}, foreign(key)
		}
	}
	slices.SortFunc(st.queue, func(a, b ticket) int { return int(a.create - b.create) })
	return st, nil
}

// parseTicket reads a ticket key; ok is false for a key that is not one
// lockagent wrote.
func (k keys) parseTicket(kv *mvccpb.KeyValue) (ticket, bool) {
	rest, ok := strings.CutPrefix(string(kv.Key), k.queue())
	var v ticketValue
	if !ok || len(rest) < 3 || rest[1] != '/' || json.Unmarshal(kv.Value, &v) != nil || v.Version != valueVersion {
		return ticket{}, false
	}
	t := ticket{id: rest[2:], mode: backend.Shared, life: time.Duration(v.Life) * time.Millisecond, create: kv.CreateRevision, lease: clientv3.LeaseID(kv.Lease)}
	switch rest[0] {
	case 'x':
		t.mode = backend.Exclusive
	case 's':
	default:
		return ticket{}, false
	}
	return t, true
}

func foreign(key string) error {
	return fmt.Errorf("%w: %s", backend.ErrForeignKey, key)
}

// holderOf returns the holder of lease id, or nil.
func (st *state) holderOf(id string) *holder {
	for i := range st.holders {
		if st.holders[i].id == id {
			return &st.holders[i]
		}
	}
	return nil
}

// ticketOf returns the ticket, or nil.
func (st *state) ticketOf(id string) *ticket {
	for i := range st.queue {
		if st.queue[i].id == id {
			return &st.queue[i]
		}
	}
	return nil
}

// head is the tickets that may ask: the first, and every shared one
// right after a shared first.
func (st *state) head() []ticket {
	if len(st.queue) == 0 {
		return nil
	}
	n := 1
	if st.queue[0].mode == backend.Shared {
		for n < len(st.queue) && st.queue[n].mode == backend.Shared {
			n++
		}
	}
	return st.queue[:n]
}

// outcome is what an acquire may do in a state.
type outcome int

const (
	grant     outcome = iota // grant the request
	deny                     // a conflict: retry later
	repeat                   // the lease id already holds the name in its mode
	otherMode                // the lease id holds the name in the other mode
)

// decide applies the rules of backend.AcquireRequest to st: first come,
// first served between tickets, then the holders' modes and the limit.
// On deny it also returns RetryIn; on grant, how many shared tickets are
// ahead of the request's at the head of the queue.
func (st *state) decide(req backend.AcquireRequest) (out outcome, retryIn time.Duration, ahead int) {
	if h := st.holderOf(req.LeaseID); h != nil {
		if h.mode != req.Mode {
			return otherMode, 0, 0
		}
		return repeat, 0, 0
	}
	// ahead: the shared tickets before this one at the head, whose
	// places under a limit come first.
	if len(st.queue) > 0 {
		head := st.head()
		at := slices.IndexFunc(head, func(t ticket) bool { return req.Ticket != "" && t.id == req.Ticket })
		if at < 0 {
			return deny, head[0].life, 0
		}
		ahead = at
	}
	var shortest, longest time.Duration
	shared := 0
	for _, h := range st.holders {
		if h.mode == backend.Exclusive {
			return deny, h.ttl(), 0
		}
		shared++
		if shortest == 0 || h.ttl() < shortest {
			shortest = h.ttl()
		}
		longest = max(longest, h.ttl())
	}
	switch {
	case req.Mode == backend.Exclusive && shared > 0:
		return deny, longest, 0
	case req.Mode == backend.Shared && req.Limit > 0 && shared+ahead >= req.Limit:
		if shared > 0 {
			return deny, shortest, 0
		}
		return deny, st.queue[0].life, 0
	}
	return grant, 0, ahead
}

// slotsFor returns the slots a shared grant under limit checks are free,
// the last of which it takes, and whether the grant may run beside
// others (see grantConditions). When every shared holder is in a slot
// below limit, a waiter with ahead shared tickets before it checks the
// first ahead+1 free slots and takes the last, leaving the others to the
// tickets ahead; a request that does not queue takes the free slot that
// pick picks among the first ones, so that tries at once take different
// ones. Otherwise (holders
// without a limit, or in slots of a larger one), the grant takes the
// first free slot, and goes alone.
func (st *state) slotsFor(limit, ahead int, queued bool, pick func(n int) int) (slots []int64, beside bool) {
	taken := map[int64]bool{}
	beside = true
	for _, h := range st.holders {
		if h.mode != backend.Shared {
			continue
		}
		if h.slot < 0 || h.slot >= int64(limit) {
			beside = false
		}
		if h.slot >= 0 {
			taken[h.slot] = true
		}
	}
	want := ahead + 1
	if !queued && beside {
		// A window of free slots to pick from.
		want = 64
	}
	var free []int64
	for n := int64(0); n < int64(limit) && len(free) < want; n++ {
		if !taken[n] {
			free = append(free, n)
		}
	}
	switch {
	case !beside:
		return free[:1], false
	case !queued:
		i := pick(len(free))
		return free[i : i+1], true
	}
	return free[:ahead+1], true
}

// conflicting tells whether st holds a lease that keeps a lease of mode
// out: one that took its name over.
func (st *state) conflicting(id string, mode backend.Mode) bool {
	for _, h := range st.holders {
		if h.id != id && (mode == backend.Exclusive || h.mode == backend.Exclusive) {
			return true
		}
	}
	return false
}
