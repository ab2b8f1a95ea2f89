package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// upgradeProbes is how many connections make acquire+release pairs while
// an agent is upgraded: what its clients wait is what they measure.
const upgradeProbes = 8

// upgradeRun is what one backend's upgrades measured.
type upgradeRun struct {
	took    []time.Duration // each upgrade op's round trip
	waited  []time.Duration // each upgrade's clients' wait, as the agent reports it
	longest time.Duration   // the longest call of any probe, upgrades included
	calls   int64           // the probes' calls
}

// upgrades upgrades an agent holding b.sessions sessions of one lease each,
// b.upgradeRounds times, while probes make acquire+release pairs on
// connections of their own.
func (b *bench) upgrades(t *table) error {
	for _, backend := range []struct{ name, block string }{{"embedded", ""}, {"redis", b.redisBlock()}} {
		a, err := startAgent(b.bin, b.dir, "upgrade-"+backend.name, backend.block)
		if err != nil {
			return err
		}
		run, err := measureUpgrades(a, b.sessions, b.upgradeRounds)
		a.stop()
		if err != nil {
			return fmt.Errorf("%s: %w", backend.name, err)
		}
		slices.Sort(run.took)
		slices.Sort(run.waited)
		t.upgrades = append(t.upgrades, []string{backend.name, strconv.Itoa(b.sessions), strconv.Itoa(len(run.took)),
			ms(run.took[len(run.took)/2]), ms(run.took[len(run.took)-1]),
			ms(run.waited[len(run.waited)/2]), ms(run.waited[len(run.waited)-1]),
			ms(run.longest), strconv.FormatInt(run.calls, 10)})
		if b.sessions == 10000 {
			t.target(fmt.Sprintf("upgrade with 10,000 sessions (%s): the longest a request waited, ms", backend.name),
				float64(run.longest.Microseconds())/1000, "< 250", run.longest < 250*time.Millisecond)
		}
	}
	return nil
}

// measureUpgrades holds n leases, one per session, then upgrades the agent
// rounds times, a second apart, while the probes run.
func measureUpgrades(a *agentProc, n, rounds int) (upgradeRun, error) {
	var run upgradeRun
	closeAll, err := holdLeases(a.socket, "bench/upgrade", n, 1, 15*time.Second)
	if err != nil {
		return run, err
	}
	defer closeAll()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	halt := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer halt()
	var longest, calls atomic.Int64
	errs := make([]error, upgradeProbes)
	for i := range upgradeProbes {
		c, err := dialLine(a.socket)
		if err != nil {
			return run, err
		}
		wg.Go(func() {
			defer c.close()
			line := fmt.Appendf(nil, `{"id":1,"op":"acquire","name":"bench/upgrade-probe/%d"}`+"\n", i)
			timed := func(f func() error) error {
				began := time.Now()
				err := f()
				if d := int64(time.Since(began)); d > longest.Load() {
					longest.Store(d)
				}
				calls.Add(1)
				return err
			}
			for {
				select {
				case <-stop:
					return
				default:
				}
				var lease string
				err := timed(func() (err error) { lease, err = c.acquire(line); return err })
				if err == nil {
					err = timed(func() error { return c.release(lease) })
				}
				if err != nil {
					errs[i] = fmt.Errorf("probe %d: %w", i, err)
					return
				}
			}
		})
	}

	admin, err := dialLine(a.socket)
	if err != nil {
		return run, err
	}
	defer admin.close()
	for range rounds {
		time.Sleep(time.Second)
		began := time.Now()
		resp, err := admin.roundTrip([]byte(`{"id":1,"op":"upgrade"}` + "\n"))
		if err != nil {
			return run, err
		}
		took := time.Since(began)
		var up struct {
			OK  bool `json:"ok"`
			PID int  `json:"pid"`
		}
		if err := json.Unmarshal(resp, &up); err != nil || !up.OK {
			return run, fmt.Errorf("upgrade: %s", resp)
		}
		a.pid = up.PID
		resp, err = admin.roundTrip([]byte(`{"id":2,"op":"status"}` + "\n"))
		if err != nil {
			return run, err
		}
		var st struct {
			UpgradeMs int64 `json:"upgrade_ms"`
		}
		if err := json.Unmarshal(resp, &st); err != nil {
			return run, fmt.Errorf("status: %s", resp)
		}
		run.took = append(run.took, took)
		run.waited = append(run.waited, time.Duration(st.UpgradeMs)*time.Millisecond)
	}
	halt()
	for _, err := range errs {
		if err != nil {
			return run, err
		}
	}
	run.longest, run.calls = time.Duration(longest.Load()), calls.Load()
	return run, nil
}

// alive tells whether the process pid runs: neither gone nor a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// stopUpgraded stops the process an upgrade handed the agent over to,
// which is not this process's child.
func stopUpgraded(pid int) {
	syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(10 * time.Second); alive(pid) && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
	}
	if alive(pid) {
		syscall.Kill(pid, syscall.SIGKILL)
	}
}
