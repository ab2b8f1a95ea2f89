package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockagent/lockagent/internal/testkit"
)

// sentinelTimeout bounds setting up a sentinel and a failover.
const sentinelTimeout = 30 * time.Second

// masterName is the name the sentinel monitors the primary under.
const masterName = "mymaster"

// Sentinel is a primary, one replica and one sentinel (quorum 1) that
// monitors them, owned by a test.
type Sentinel struct {
	sentinel *Server
	opts     SentinelOptions

	mu      sync.Mutex // guards primary and replica, swapped by Failover
	primary *Server
	replica *Server
}

// SentinelOptions configures the sentinel of StartSentinel.
type SentinelOptions struct {
	// Username and Password, when set, are the only user the sentinel
	// accepts (an ACL user with every permission; its default user is
	// off); the servers themselves require none.
	Username, Password string
}

// StartSentinel starts a primary, a replica of it and a sentinel
// (down-after-milliseconds 1000, failover-timeout 5000), and waits until the
// replica is in sync and the sentinel knows both as master and replica.
func StartSentinel(tb testing.TB, opts SentinelOptions) *Sentinel {
	tb.Helper()
	testkit.SkipShort(tb, "redis-server")
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()

	primary := Start(tb, Options{})
	host, port, _ := net.SplitHostPort(primary.Addr())
	replica := Start(tb, Options{Args: []string{"--replicaof", host, port}})
	waitFor(ctx, tb, "replica "+replica.Addr()+" in sync", func() error {
		return inSync(ctx, primary.Addr(), replica.Addr())
	})

	s := newServer(tb, Options{})
	dir, err := filepath.Abs(s.dir)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	// The sentinel rewrites its config file, so it must be its own and
	// writable; the command-line options apply on top of it.
	conf := filepath.Join(dir, "sentinel.conf")
	text := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 1\n"+
		"sentinel down-after-milliseconds %[1]s 1000\n"+
		"sentinel failover-timeout %[1]s 5000\n", masterName, host, port)
	if opts.Username != "" {
		text += fmt.Sprintf("user default off\nuser %s on >%s allcommands allkeys allchannels\n", opts.Username, opts.Password)
	}
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	s.conf = conf
	s.extra = []string{"--sentinel"}
	s.startFresh(tb)

	sn := &Sentinel{sentinel: s, opts: opts, primary: primary, replica: replica}
	waitFor(ctx, tb, "sentinel to know master and replica", func() error {
		return sn.knows(ctx, primary.Addr(), replica.Addr())
	})
	return sn
}

// inSync reports whether the replica's link to the primary is up and the
// primary sees it online.
func inSync(ctx context.Context, primary, replica string) error {
	r, err := replication(ctx, replica)
	if err != nil {
		return err
	}
	if !strings.Contains(r, "master_link_status:up") {
		return fmt.Errorf("replica: %s", strings.Join(strings.Fields(r), " "))
	}
	p, err := replication(ctx, primary)
	if err != nil {
		return err
	}
	if !strings.Contains(p, "state=online") {
		return fmt.Errorf("primary: %s", strings.Join(strings.Fields(p), " "))
	}
	return nil
}

// replication returns INFO replication of the server at addr.
func replication(ctx context.Context, addr string) (string, error) {
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	return rc.Info(ctx, "replication").Result()
}

// sentinelClient returns a client for the sentinel; the caller closes it.
func (sn *Sentinel) sentinelClient() *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: sn.sentinel.Addr(), MaxRetries: -1,
		Username: sn.opts.Username, Password: sn.opts.Password})
}

// knows reports whether the sentinel has master as the master and replica
// as a healthy replica, so that a failover can pick it.
func (sn *Sentinel) knows(ctx context.Context, master, replica string) error {
	sc := sn.sentinelClient()
	defer sc.Close()
	if err := reportsMaster(ctx, sc, master); err != nil {
		return err
	}
	reps, err := sc.Replicas(ctx, masterName).Result()
	if err != nil {
		return err
	}
	for _, r := range reps {
		if net.JoinHostPort(r["ip"], r["port"]) == replica &&
			r["flags"] == "slave" && r["master-link-status"] == "ok" {
			return nil
		}
	}
	return fmt.Errorf("sentinel replicas: %v", reps)
}

// reportsMaster reports whether the sentinel names addr as the master.
func reportsMaster(ctx context.Context, sc *redis.SentinelClient, addr string) error {
	a, err := sc.GetMasterAddrByName(ctx, masterName).Result()
	if err != nil {
		return err
	}
	if len(a) != 2 || net.JoinHostPort(a[0], a[1]) != addr {
		return fmt.Errorf("sentinel reports master %v, want %s", a, addr)
	}
	return nil
}

// MasterName returns the name the sentinel monitors the primary under.
func (sn *Sentinel) MasterName() string { return masterName }

// SentinelAddrs returns the sentinels' host:port (there is one).
func (sn *Sentinel) SentinelAddrs() []string { return []string{sn.sentinel.Addr()} }

// Primary returns the server that is master: the one started as primary,
// or the former replica after Failover.
func (sn *Sentinel) Primary() *Server {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	return sn.primary
}

// Replica returns the server that is the replica: the one started as
// replica, or the former primary after Failover (which the sentinel turns
// into a replica of the new master).
func (sn *Sentinel) Replica() *Server {
	sn.mu.Lock()
	defer sn.mu.Unlock()
	return sn.replica
}

// Failover asks the sentinel for a failover (SENTINEL FAILOVER) and waits
// until the sentinel reports the replica as master and that server says
// role:master; then Primary and Replica swap. It does not wait for the
// former primary to finish resyncing as a replica.
func (sn *Sentinel) Failover(tb testing.TB) {
	tb.Helper()
	sc := sn.sentinelClient()
	defer sc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	if err := sc.Failover(ctx, masterName).Err(); err != nil {
		tb.Fatalf("redistest: SENTINEL FAILOVER %s: %v", masterName, err)
	}
	sn.AwaitFailover(tb)
}

// AwaitFailover waits until the sentinel reports the replica as master and
// that server says role:master, as after Failover or once the primary has
// been down (killed, or paused) for down-after-milliseconds; then Primary
// and Replica swap.
func (sn *Sentinel) AwaitFailover(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer cancel()
	next := sn.Replica()
	sc := sn.sentinelClient()
	defer sc.Close()
	waitFor(ctx, tb, "sentinel to report "+next.Addr()+" as master", func() error {
		if err := reportsMaster(ctx, sc, next.Addr()); err != nil {
			return err
		}
		r, err := replication(ctx, next.Addr())
		if err != nil {
			return err
		}
		if !strings.Contains(r, "role:master") {
			return fmt.Errorf("new master: %s", strings.Join(strings.Fields(r), " "))
		}
		return nil
	})
	sn.mu.Lock()
	sn.primary, sn.replica = sn.replica, sn.primary
	sn.mu.Unlock()
}
