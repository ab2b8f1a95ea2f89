package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockagent/lockagent/backend"
	"github.com/lockagent/lockagent/backend/etcd"
	"github.com/lockagent/lockagent/backend/redis"
	"github.com/lockagent/lockagent/internal/testkit/etcdtest"
	"github.com/lockagent/lockagent/internal/testkit/faultproxy"
	"github.com/lockagent/lockagent/internal/testkit/lockcheck"
	"github.com/lockagent/lockagent/internal/testkit/redistest"
)

// TestGrantOrder checks the grant order of one exclusive name as the
// store itself recorded it, with no excuse for faults
// (lockcheck.CheckGrantOrder): on a three-member etcd whose leader is
// killed and restarted and whose followers are paused while three
// agents contend, the history of etcd's own revisions shows every grant
// after the end of the one before; on Redis, one failover to a replica
// that had not received the last grant breaks it.
func TestGrantOrder(t *testing.T) {
	t.Run("etcd", func(t *testing.T) {
		tenures := etcdGrantOrder(t)
		vs := lockcheck.CheckGrantOrder(tenures)
		report(t, "etcd, leader killed, followers paused", tenures, vs)
		require.Greater(t, len(tenures), 20, "grants in etcd's history")
		require.Empty(t, vs, "no two holders overlap in etcd's order")
	})
	t.Run("redis", func(t *testing.T) {
		tenures := redisGrantOrder(t)
		vs := lockcheck.CheckGrantOrder(tenures)
		report(t, "redis, one failover", tenures, vs)
		require.Len(t, vs, 1, "a failover that loses a grant breaks the grant order, once")
		require.Contains(t, vs[0].Detail, "after granted at", "the grant after the failover")
		require.Contains(t, vs[0].Detail, "lost, granted at", "overlaps the grant the failover lost")
	})
}

func report(t *testing.T, what string, tenures []lockcheck.Tenure, vs []lockcheck.Violation) {
	line := fmt.Sprintf("grant order: %s: grants=%d violations=%d", what, len(tenures), len(vs))
	fmt.Println(line)
	t.Log(line)
	for _, v := range vs {
		t.Log(v)
	}
}

// contend runs three backends acquiring and releasing one name, each
// holding a few milliseconds, until stop is closed.
func contend(t *testing.T, bs []backend.Backend, name string, stop <-chan struct{}) {
	var wg sync.WaitGroup
	for i, b := range bs {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				req := backend.AcquireRequest{Name: name, LeaseID: fmt.Sprintf("b%d-%d", i, n), Mode: backend.Exclusive, TTL: 2 * time.Second}
				ctx, cancel := context.WithTimeout(t.Context(), time.Second)
				_, err := b.Acquire(ctx, req)
				cancel()
				if err != nil {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				time.Sleep(5 * time.Millisecond)
				ctx, cancel = context.WithTimeout(t.Context(), time.Second)
				_ = b.Release(ctx, backend.LeaseKey{Name: name, LeaseID: req.LeaseID, Mode: req.Mode})
				cancel()
			}
		})
	}
	wg.Wait()
}

// etcdGrantOrder contends for a name on three members through member
// faults, then reads the tenures from etcd's history of the holder keys:
// a key's creation is a grant at its revision, its deletion (a release,
// an expiry) the end, at the deletion's revision.
func etcdGrantOrder(t *testing.T) []lockcheck.Tenure {
	c := etcdtest.Start(t, etcdtest.Options{Members: 3})
	var bs []backend.Backend
	for range 3 {
		cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		require.NoError(t, err)
		b, err := etcd.Open(t.Context(), etcd.Options{Client: cli, KeyPrefix: "order"})
		require.NoError(t, err)
		t.Cleanup(func() { b.Close() })
		bs = append(bs, b)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { contend(t, bs, "x", stop); close(done) }()
	time.Sleep(time.Second)
	leader := c.Leader(t)
	c.Member(leader).Kill()
	time.Sleep(time.Second)
	c.Member(leader).Restart(t)
	for range 2 {
		follower := (c.Leader(t) + 1) % 3
		c.Member(follower).Pause()
		time.Sleep(time.Second)
		c.Member(follower).Resume()
	}
	time.Sleep(500 * time.Millisecond)
	close(stop)
	<-done

	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	now, err := cli.Get(ctx, "order/")
	require.NoError(t, err)
	dir := "order/n/x/k/h/x/"
	open := map[string]int{}
	var tenures []lockcheck.Tenure
	wch := cli.Watch(ctx, dir, clientv3.WithPrefix(), clientv3.WithRev(1))
	for resp := range wch {
		require.NoError(t, resp.Err())
		for _, ev := range resp.Events {
			id := strings.TrimPrefix(string(ev.Kv.Key), dir)
			switch {
			case ev.Type == clientv3.EventTypeDelete:
				if i, ok := open[id]; ok {
					tenures[i].End = uint64(ev.Kv.ModRevision)
					delete(open, id)
				}
			case ev.Kv.CreateRevision == ev.Kv.ModRevision:
				open[id] = len(tenures)
				tenures = append(tenures, lockcheck.Tenure{Name: "x", Holder: id, Granted: uint64(ev.Kv.CreateRevision)})
			}
		}
		if resp.Header.Revision >= now.Header.Revision && (len(resp.Events) == 0 || resp.Events[len(resp.Events)-1].Kv.ModRevision >= now.Header.Revision) {
			break
		}
	}
	return tenures
}

// redisGrantOrder contends for a name on a primary with a replica, then
// fails over to the replica after a grant it had not received (its link
// to the primary black-holed), and another agent takes the name there. The tenures come from
// what each server recorded, by MONITOR: a holder key written is a grant
// at its token (Redis's clock in µs), its deletion the end, at the
// server's time.
func redisGrantOrder(t *testing.T) []lockcheck.Tenure {
	primary := redistest.Start(t, redistest.Options{})
	// The replica replicates through a fault proxy, which the failover
	// black-holes: what the primary sends then never arrives.
	link := faultproxy.New(t, primary.Addr())
	host, port, _ := net.SplitHostPort(link.Addr())
	replica := redistest.Start(t, redistest.Options{Args: []string{"--replicaof", host, port}})
	rc := replica.Client(t)
	require.Eventually(t, func() bool {
		info, err := rc.Info(t.Context(), "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 10*time.Second, 20*time.Millisecond, "the replica in sync")

	var mon monitors
	mon.start(t, primary.Addr())
	mon.start(t, replica.Addr())
	openOn := func(addr string) backend.Backend {
		b, err := redis.Open(t.Context(), redis.Options{KeyPrefix: "order",
			Client: goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})})
		require.NoError(t, err)
		t.Cleanup(func() { b.Close() })
		return b
	}
	var bs []backend.Backend
	for range 3 {
		bs = append(bs, openOn(primary.Addr()))
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { contend(t, bs, "x", stop); close(done) }()
	time.Sleep(time.Second)
	close(stop)
	<-done

	// The replica has the contention's last release before its link
	// goes: else its promotion would keep that holder, and refuse the
	// grant that must overlap the lost one.
	require.Eventually(t, func() bool {
		n, err := rc.Exists(t.Context(), "order:lk:{x}").Result()
		return err == nil && n == 0
	}, 10*time.Second, time.Millisecond, "the replica has the last release")

	// The failover: a grant the replica has not received, the primary
	// dies, the replica is promoted, and another agent takes the name.
	link.Blackhole()
	_, err := bs[0].Acquire(t.Context(), backend.AcquireRequest{Name: "x", LeaseID: "lost", Mode: backend.Exclusive, TTL: 10 * time.Second})
	require.NoError(t, err)
	// Its MONITOR line may leave the primary after the answer: killed at
	// once, the primary would take it along, and the history lack the
	// grant the failover loses.
	mon.await(t, 0, `"lost"`)
	primary.Kill()
	require.NoError(t, rc.Do(t.Context(), "REPLICAOF", "NO", "ONE").Err())
	_, err = openOn(replica.Addr()).Acquire(t.Context(), backend.AcquireRequest{Name: "x", LeaseID: "after", Mode: backend.Exclusive, TTL: 10 * time.Second})
	require.NoError(t, err)
	mon.await(t, 1, `"after"`)
	return mon.stop(t)
}

// monitors reads MONITOR on several servers.
type monitors struct {
	wg    sync.WaitGroup
	conns []net.Conn
	mu    sync.Mutex
	lines [][]string // per server
}

func (m *monitors) start(t *testing.T, addr string) {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	_, err = c.Write([]byte("MONITOR\r\n"))
	require.NoError(t, err)
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "+OK\r\n", line)
	m.conns = append(m.conns, c)
	m.mu.Lock()
	server := len(m.lines)
	m.lines = append(m.lines, nil)
	m.mu.Unlock()
	m.wg.Go(func() {
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			m.mu.Lock()
			m.lines[server] = append(m.lines[server], strings.TrimSpace(strings.TrimPrefix(line, "+")))
			m.mu.Unlock()
		}
	})
}

// await waits until server's MONITOR has shown a line containing s.
func (m *monitors) await(t *testing.T, server int, s string) {
	t.Helper()
	require.Eventually(t, func() bool {
		m.mu.Lock()
		defer m.mu.Unlock()
		return slices.ContainsFunc(m.lines[server], func(l string) bool { return strings.Contains(l, s) })
	}, 5*time.Second, time.Millisecond, "MONITOR of server %d shows %s", server, s)
}

var quoted = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)

// stop ends the monitors (once await has seen the last line wanted) and returns the tenures of name x they saw:
// HSET of its holder key with a token, then DEL of it.
func (m *monitors) stop(t *testing.T) []lockcheck.Tenure {
	for _, c := range m.conns {
		c.Close()
	}
	m.wg.Wait()
	const key = "order:lk:{x}"
	byID := map[string]int{}
	var tenures []lockcheck.Tenure
	// Each server's log in its order: a DEL ends the grant the server
	// last wrote. A replica logs what it replicates later than its
	// primary: a tenure ends at the earliest time a server saw it end.
	for _, lines := range m.lines {
		open := ""
		for _, line := range lines {
			ts, rest, _ := strings.Cut(line, " ")
			sec, us, _ := strings.Cut(ts, ".")
			s, err1 := strconv.ParseUint(sec, 10, 64)
			u, err2 := strconv.ParseUint(us, 10, 64)
			if err1 != nil || err2 != nil {
				continue
			}
			at := s*1_000_000 + u
			var args []string
			for _, q := range quoted.FindAllStringSubmatch(rest, -1) {
				args = append(args, q[1])
			}
			if len(args) < 2 || args[1] != key {
				continue
			}
			switch strings.ToUpper(args[0]) {
			case "HSET":
				var id string
				var tok uint64
				for i := 2; i+1 < len(args); i += 2 {
					switch args[i] {
					case "o":
						id = args[i+1]
					case "k":
						tok, _ = strconv.ParseUint(args[i+1], 10, 64)
					}
				}
				if tok == 0 {
					continue
				}
				open = id
				if _, ok := byID[id]; !ok {
					byID[id] = len(tenures)
					tenures = append(tenures, lockcheck.Tenure{Name: "x", Holder: id, Granted: tok})
				}
			case "DEL":
				if i, ok := byID[open]; ok && open != "" {
					if tenures[i].End == 0 || at < tenures[i].End {
						tenures[i].End = at
					}
				}
				open = ""
			}
		}
	}
	require.NotEmpty(t, tenures, "MONITOR saw grants")
	return tenures
}
