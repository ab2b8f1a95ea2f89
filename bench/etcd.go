package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// etcdCluster is three etcd members on loopback ports, with etcd's
// default timing and their data on the bench's directory (a disk, with
// its fsync, as a deployment has).
type etcdCluster struct {
	cmds      []*exec.Cmd
	endpoints []string
}

func startEtcd(dir string) (*etcdCluster, error) {
	const members = 3
	var ports []int
	for range 2 * members {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	url := func(p int) string { return "http://127.0.0.1:" + strconv.Itoa(p) }
	var initial []string
	for i := range members {
		initial = append(initial, fmt.Sprintf("m%d=%s", i, url(ports[2*i+1])))
	}
	c := &etcdCluster{}
	for i := range members {
		d := filepath.Join(dir, fmt.Sprintf("etcd-m%d", i))
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
		logf, err := os.Create(filepath.Join(d, "etcd.log"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command("etcd", "--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(d, "data"),
			"--listen-client-urls", url(ports[2*i]), "--advertise-client-urls", url(ports[2*i]),
			"--listen-peer-urls", url(ports[2*i+1]), "--initial-advertise-peer-urls", url(ports[2*i+1]),
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "bench", "--logger", "zap", "--log-level", "warn")
		cmd.Stdout, cmd.Stderr = logf, logf
		err = cmd.Start()
		logf.Close()
		if err != nil {
			c.stop()
			return nil, fmt.Errorf("start etcd (is etcd-server installed?): %w", err)
		}
		c.cmds = append(c.cmds, cmd)
		c.endpoints = append(c.endpoints, fmt.Sprintf("127.0.0.1:%d", ports[2*i]))
	}
	cli, err := c.client()
	if err != nil {
		c.stop()
		return nil, err
	}
	defer cli.Close()
	err = poll(20*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Put(ctx, "bench/ready", "")
		return err
	})
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("etcd: %w", err)
	}
	return c, nil
}

func (c *etcdCluster) client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: c.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

func (c *etcdCluster) block() string {
	q := make([]string, len(c.endpoints))
	for i, ep := range c.endpoints {
		q[i] = strconv.Quote(ep)
	}
	return fmt.Sprintf("backend \"etcd\" {\n  endpoints = [%s]\n}\n", strings.Join(q, ", "))
}

// cpu is the CPU seconds the members have used.
func (c *etcdCluster) cpu() float64 {
	var sum float64
	for _, cmd := range c.cmds {
		v, _ := cpuSeconds(cmd.Process.Pid)
		sum += v
	}
	return sum
}

func (c *etcdCluster) stop() {
	for _, cmd := range c.cmds {
		cmd.Process.Kill()
		cmd.Wait()
	}
}

// etcdPutRoundTrips measures single writes, etcd's floor for a grant.
func etcdPutRoundTrips(cli *clientv3.Client, workers, n int) (result, error) {
	ctx := context.Background()
	return measure(workers, n, func(i int) (worker, error) {
		key := fmt.Sprintf("bench/put/%d", i)
		return worker{op: func() error { _, err := cli.Put(ctx, key, "x"); return err }, close: func() {}}, nil
	})
}

// etcdMutexPairs locks and unlocks a mutex of the goroutine's own with
// etcd's concurrency package, as an application using it directly does:
// a session (an etcd lease, kept alive by the client) per goroutine.
func etcdMutexPairs(cli *clientv3.Client, workers, n int) (result, error) {
	ctx := context.Background()
	return measure(workers, n, func(i int) (worker, error) {
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(15))
		if err != nil {
			return worker{}, err
		}
		m := concurrency.NewMutex(s, fmt.Sprintf("bench/mutex/%d", i))
		return worker{
			op: func() error {
				if err := m.Lock(ctx); err != nil {
					return err
				}
				return m.Unlock(ctx)
			},
			close: func() { s.Close() },
		}, nil
	})
}

// etcd measures the pairs on a three-member etcd, lockagent's and
// concurrency.Mutex's, and the renewal load of held leases.
func (b *bench) etcd(t *table) error {
	ec, err := startEtcd(b.dir)
	if err != nil {
		return err
	}
	defer ec.stop()
	cli, err := ec.client()
	if err != nil {
		return err
	}
	defer cli.Close()
	a, err := startAgent(b.bin, b.dir, "etcd", ec.block())
	if err != nil {
		return err
	}
	defer a.stop()

	var rows []workload
	for _, w := range []int{1, 64} {
		rows = append(rows,
			workload{"etcd Put (clientv3)", w, "round trip", func(w, n int) (result, error) { return etcdPutRoundTrips(cli, w, n) }},
			workload{"lockagent, etcd", w, "pair", func(w, n int) (result, error) { return agentPairs(a.socket, w, n) }},
			workload{"etcd concurrency.Mutex", w, "pair", func(w, n int) (result, error) { return etcdMutexPairs(cli, w, n) }},
		)
	}
	got := make([][]result, len(rows))
	for range b.rounds {
		for i, r := range rows {
			n := b.n1
			if r.workers > 1 {
				n = b.n64
			}
			// etcd commits a write in milliseconds: a tenth of the Redis
			// rows' operations give as many samples per second.
			n = max(n/10, 10*r.workers)
			a0, e0 := cpuOf(a), ec.cpu()
			res, err := r.run(r.workers, n)
			if err != nil {
				return fmt.Errorf("%s ×%d: %w", r.name, r.workers, err)
			}
			ops := float64(n / r.workers * r.workers)
			res.agentCPU = 1e6 * (cpuOf(a) - a0) / ops
			res.redisCPU = 1e6 * (ec.cpu() - e0) / ops
			got[i] = append(got[i], res)
		}
	}
	for i, r := range rows {
		m := median(got[i])
		agentCPU := fmt.Sprintf("%.1f", m.agentCPU)
		if !strings.HasPrefix(r.name, "lockagent") {
			agentCPU = "-"
		}
		t.etcdPairs = append(t.etcdPairs, []string{r.name, strconv.Itoa(r.workers), r.perOp, us(m.p50), us(m.p99), fmt.Sprintf("%.0f", m.perSec),
			agentCPU, fmt.Sprintf("%.1f", m.redisCPU)})
	}

	for _, n := range b.etcdHeld {
		l, err := measureEtcdRenewals(a, ec, n, 15*time.Second, b.window)
		if err != nil {
			return fmt.Errorf("%d leases on etcd: %w", n, err)
		}
		t.etcdRenewal = append(t.etcdRenewal, []string{strconv.Itoa(n), fmt.Sprintf("%.2f", l.agentCPU), fmt.Sprintf("%.2f", l.redisCPU)})
	}
	return nil
}

func cpuOf(a *agentProc) float64 {
	v, _ := cpuSeconds(a.cmd.Process.Pid)
	return v
}

// measureEtcdRenewals holds n leases of ttl through the agent on etcd and
// measures, over window, the CPU the agent and the three members spend
// keeping them.
func measureEtcdRenewals(a *agentProc, ec *etcdCluster, n int, ttl, window time.Duration) (renewalLoad, error) {
	const perSession = 1000
	closeAll, err := holdLeases(a.socket, fmt.Sprintf("bench/etcdheld%d", n), (n+perSession-1)/perSession, perSession, ttl)
	if err != nil {
		return renewalLoad{}, err
	}
	defer closeAll()
	time.Sleep(ttl / 2)
	a0, e0, t0 := cpuOf(a), ec.cpu(), time.Now()
	time.Sleep(window)
	secs := time.Since(t0).Seconds()
	return renewalLoad{leases: n, agentCPU: 100 * (cpuOf(a) - a0) / secs, redisCPU: 100 * (ec.cpu() - e0) / secs}, nil
}
