package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
)

// holdLeases opens sessions connections to the agent at socket and acquires
// perSession names on each, all requests of a connection written before
// their answers are read. The leases stay held until the returned close.
func holdLeases(socket, prefix string, sessions, perSession int, ttl time.Duration) (close func(), err error) {
	conns := make([]*lineConn, sessions)
	closeAll := func() {
		for _, c := range conns {
			if c != nil {
				c.close()
			}
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, sessions)
	for i := range conns {
		c, err := dialLine(socket)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("session %d: %w", i, err)
		}
		conns[i] = c
		wg.Go(func() { errs[i] = acquireMany(c, fmt.Sprintf("%s/%d", prefix, i), perSession, ttl) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		closeAll()
		return nil, err
	}
	return closeAll, nil
}

// acquireMany acquires n names on one connection: a goroutine writes the
// requests while the answers are read.
func acquireMany(c *lineConn, prefix string, n int, ttl time.Duration) error {
	go func() {
		var buf []byte
		for j := range n {
			buf = fmt.Appendf(buf, `{"id":%d,"op":"acquire","name":"%s/%d","ttl_ms":%d}`+"\n", j, prefix, j, ttl.Milliseconds())
			if len(buf) > 32<<10 || j == n-1 {
				if _, err := c.nc.Write(buf); err != nil {
					return
				}
				buf = buf[:0]
			}
		}
	}()
	for got := 0; got < n; {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return err
		}
		if bytes.HasPrefix(line, []byte(`{"event"`)) {
			continue
		}
		if !bytes.Contains(line, []byte(`"acquired":true`)) {
			return fmt.Errorf("not granted: %s", line)
		}
		got++
	}
	return nil
}

// renewalLoad is the steady-state cost of holding leases.
type renewalLoad struct {
	leases      int
	agentCPU    float64 // percent of one core
	redisCPU    float64 // percent of one core
	redisCmdSec float64
}

// measureRenewals holds n leases of ttl on the agent, waits for renewals
// to reach their steady state, then measures the agent's and Redis's CPU
// and Redis's commands per second over window.
func measureRenewals(a *agentProc, rs *redisServer, n int, ttl, window time.Duration) (renewalLoad, error) {
	const perSession = 1000
	closeAll, err := holdLeases(a.socket, fmt.Sprintf("bench/held%d", n), (n+perSession-1)/perSession, perSession, ttl)
	if err != nil {
		return renewalLoad{}, err
	}
	defer closeAll()
	// A full renewal cycle (a third of the TTL) before measuring, so that
	// the burst of acquisitions is over and every lease renews at its
	// own pace.
	time.Sleep(ttl / 2)
	ctx := context.Background()
	rc := rs.client(1)
	defer rc.Close()
	pid := a.cmd.Process.Pid
	a0, err := cpuSeconds(pid)
	if err != nil {
		return renewalLoad{}, err
	}
	r0, err := rs.stats(ctx, rc)
	if err != nil {
		return renewalLoad{}, err
	}
	t0 := time.Now()
	time.Sleep(window)
	a1, err := cpuSeconds(pid)
	if err != nil {
		return renewalLoad{}, err
	}
	r1, err := rs.stats(ctx, rc)
	if err != nil {
		return renewalLoad{}, err
	}
	secs := time.Since(t0).Seconds()
	return renewalLoad{
		leases:      n,
		agentCPU:    100 * (a1 - a0) / secs,
		redisCPU:    100 * (r1.cpu - r0.cpu) / secs,
		redisCmdSec: float64(r1.commands-r0.commands-1) / secs, // less the INFO itself
	}, nil
}

// agentHandover measures, rounds times, the time from the connection of a
// holder on agent a dropping (what the kernel does when its process dies)
// to a waiter on agent b being granted the name.
func agentHandover(a, b *agentProc, rounds int) ([]time.Duration, error) {
	var ds []time.Duration
	for i := range rounds {
		name := fmt.Sprintf("bench/handover/%d", i)
		holder, err := dialLine(a.socket)
		if err != nil {
			return nil, err
		}
		if _, err := holder.acquire(fmt.Appendf(nil, `{"id":1,"op":"acquire","name":%q,"ttl_ms":15000}`+"\n", name)); err != nil {
			holder.close()
			return nil, err
		}
		waiter, err := dialLine(b.socket)
		if err != nil {
			holder.close()
			return nil, err
		}
		if _, err := waiter.nc.Write(fmt.Appendf(nil, `{"id":1,"op":"acquire","name":%q,"ttl_ms":15000,"wait_ms":10000}`+"\n", name)); err != nil {
			return nil, err
		}
		// The waiter must have asked and found the name held (its ticket
		// queued in Redis); a waiter arriving later would measure nothing.
		err = poll(10*time.Second, func() error {
			resp, err := holder.roundTrip(fmt.Appendf(nil, `{"id":2,"op":"inspect","name":%q}`+"\n", name))
			if err != nil || bytes.Contains(resp, []byte(`"queued":1`)) {
				return err
			}
			return errors.New("the waiter is not queued")
		})
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		holder.close()
		line, err := waiter.r.ReadSlice('\n')
		d := time.Since(t0)
		waiter.close()
		if err != nil {
			return nil, err
		}
		if !bytes.Contains(line, []byte(`"acquired":true`)) {
			return nil, fmt.Errorf("waiter not granted: %s", line)
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// redislockHandover measures the same with github.com/bsm/redislock: a
// holder that dies never releases, so a waiter retrying every 5 ms gets
// the key when its TTL expires.
func redislockHandover(rc *redis.Client, ttl time.Duration, rounds int) ([]time.Duration, error) {
	ctx := context.Background()
	locker := redislock.New(rc)
	var ds []time.Duration
	for i := range rounds {
		key := fmt.Sprintf("bench:handover:%d", i)
		if _, err := locker.Obtain(ctx, key, ttl, nil); err != nil {
			return nil, err
		}
		t0 := time.Now() // the holder dies here, holding the key
		wctx, cancel := context.WithTimeout(ctx, 2*ttl)
		l, err := locker.Obtain(wctx, key, ttl, &redislock.Options{RetryStrategy: redislock.LinearBackoff(5 * time.Millisecond)})
		cancel()
		if err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(t0))
		l.Release(ctx)
	}
	return ds, nil
}

// sessionsRSS opens n sessions on a fresh agent, each holding one lease,
// and returns the agent's resident memory once they are all granted, then
// at each of the offsets after that (ascending): the runtime returns the
// memory of the burst of acquisitions only after a garbage collection,
// which an agent that allocates little may run only after its two minutes
// without one.
func sessionsRSS(a *agentProc, n int, offsets []time.Duration) ([]float64, error) {
	closeAll, err := holdLeases(a.socket, "bench/rss", n, 1, 15*time.Second)
	if err != nil {
		return nil, err
	}
	defer closeAll()
	granted := time.Now()
	rss, err := rssMiB(a.cmd.Process.Pid)
	if err != nil {
		return nil, err
	}
	out := []float64{rss}
	for _, d := range offsets {
		time.Sleep(time.Until(granted.Add(d)))
		if rss, err = rssMiB(a.cmd.Process.Pid); err != nil {
			return nil, err
		}
		out = append(out, rss)
	}
	return out, nil
}
