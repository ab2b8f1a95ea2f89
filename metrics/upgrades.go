package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// upgrades are the agent's upgrades, counted across the processes it was
// handed over to: SetUpgrades sets them.
type upgrades struct {
	mu        sync.Mutex
	succeeded int64
	failed    int64
	last      time.Time     // the upgrade that handed the agent to this process
	took      time.Duration // how long its clients waited
}

var (
	upgradesDesc    = prometheus.NewDesc("lockagent_upgrades_total", "Upgrades of the agent, by result (succeeded, failed), across its processes.", []string{"result"}, nil)
	lastUpgradeDesc = prometheus.NewDesc("lockagent_last_upgrade_time_seconds", "When the last upgrade handed the agent over to this process, in seconds since the Unix epoch; 0 if none did.", nil, nil)
	upgradeWaitDesc = prometheus.NewDesc("lockagent_last_upgrade_duration_seconds", "How long the clients waited during the last upgrade (from the freeze until the new process served); 0 if none.", nil, nil)
)

func (u *upgrades) Describe(ch chan<- *prometheus.Desc) {
	ch <- upgradesDesc
	ch <- lastUpgradeDesc
	ch <- upgradeWaitDesc
}

func (u *upgrades) Collect(ch chan<- prometheus.Metric) {
	u.mu.Lock()
	defer u.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(upgradesDesc, prometheus.CounterValue, float64(u.succeeded), "succeeded")
	ch <- prometheus.MustNewConstMetric(upgradesDesc, prometheus.CounterValue, float64(u.failed), "failed")
	last := 0.0
	if !u.last.IsZero() {
		last = float64(u.last.UnixNano()) / 1e9
	}
	ch <- prometheus.MustNewConstMetric(lastUpgradeDesc, prometheus.GaugeValue, last)
	ch <- prometheus.MustNewConstMetric(upgradeWaitDesc, prometheus.GaugeValue, u.took.Seconds())
}

// SetUpgrades sets the counts of the agent's upgrades, succeeded and
// failed, and the last one that handed the agent over to this process
// (zero if none did), whose clients waited took.
func (m *Metrics) SetUpgrades(succeeded, failed int64, last time.Time, took time.Duration) {
	m.upgrades.mu.Lock()
	defer m.upgrades.mu.Unlock()
	m.upgrades.succeeded, m.upgrades.failed = succeeded, failed
	m.upgrades.last, m.upgrades.took = last, took
}
