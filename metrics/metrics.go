// Package metrics exposes what the agent does as Prometheus metrics: it is
// the agent's Observer (acquisitions, renewals, lost leases, backend
// errors) and the socket server's (connections cut off, answers refused),
// counts the agent's upgrades, and reads the agent's counts (sessions, leases, waiters, backend state)
// at each scrape. It serves them in the text format at /metrics.
//
// It knows the agent's public API only, and the server's observer by its
// methods: nothing of sockets, JSON or Redis.
// docs/metrics.md lists every metric.
package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/lockagent/lockagent/agent"
	"github.com/lockagent/lockagent/backend"
)

// Metrics is the agent's metrics and their registry. Create it with New,
// give it to agent.Config.Observer, then Watch the agent.
type Metrics struct {
	reg *prometheus.Registry

	acquisitions *prometheus.CounterVec
	acquireWait  *prometheus.HistogramVec
	renewBatch   prometheus.Histogram
	renewLatency prometheus.Histogram
	renewFailed  prometheus.Counter
	lost         *prometheus.CounterVec
	backendErrs  *prometheus.CounterVec
	cutOff       *prometheus.CounterVec
	refused      prometheus.Counter
	upgrades     upgrades

	// acquired holds the children of acquisitions and acquireWait for
	// every mode and result, made by New and read only after: the
	// vectors' own lookups hash the labels and take a lock, on the path
	// of every acquire.
	acquired map[acquiredKey]acquiredMetrics
}

type acquiredKey struct {
	mode   backend.Mode
	result string
}

type acquiredMetrics struct {
	count prometheus.Counter
	wait  prometheus.Observer
}

var _ agent.Observer = (*Metrics)(nil)

// New returns the metrics, registered with a registry of their own along
// with the Go runtime's and the process's.
func New() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		acquisitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockagent_acquisitions_total",
			Help: "Acquire requests by mode and result (granted, held, timeout, canceled, permission_denied, limit_exceeded, error).",
		}, []string{"mode", "result"}),
		acquireWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "lockagent_acquire_wait_seconds",
			Help:    "Time from an acquire request to its answer, waiting included, by result.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 10, 30, 60, 300},
		}, []string{"result"}),
		renewBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockagent_renewal_batch_size",
			Help:    "Leases renewed in one round trip to the backend.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8), // 1 … 16384
		}),
		renewLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "lockagent_renewal_duration_seconds",
			Help:    "Round-trip time of a batch of renewals.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		renewFailed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockagent_renewals_failed_total",
			Help: "Renewals whose outcome is unknown (the backend did not answer in time or failed).",
		}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockagent_leases_lost_total",
			Help: "Leases lost, by reason (expired, taken_over, broken, backend_unavailable).",
		}, []string{"reason"}),
		backendErrs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockagent_backend_errors_total",
			Help: "Backend calls that failed, by operation (acquire, renew, release).",
		}, []string{"op"}),
		cutOff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lockagent_connections_cut_off_total",
			Help: "Connections cut off for not reading what the agent sent, by reason (write_timeout, queue, uid_output, agent_output).",
		}, []string{"reason"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "lockagent_answers_refused_total",
			Help: "Answers (list, inspect, a denial's holders) too large for the room left for their uid's unread output, answered limit_exceeded.",
		}),
	}
	for _, reason := range []string{"write_timeout", "queue", "uid_output", "agent_output"} {
		m.cutOff.WithLabelValues(reason)
	}
	for _, reason := range []string{agent.ReasonExpired, agent.ReasonTakenOver, agent.ReasonBroken, agent.ReasonBackendUnavailable} {
		m.lost.WithLabelValues(reason)
	}
	for _, op := range []string{"acquire", "renew", "release"} {
		m.backendErrs.WithLabelValues(op)
	}
	m.acquired = make(map[acquiredKey]acquiredMetrics)
	for _, mode := range []backend.Mode{backend.Exclusive, backend.Shared} {
		for _, result := range []string{agent.ResultGranted, agent.ResultHeld, agent.ResultTimeout, agent.ResultCanceled,
			agent.ResultPermissionDenied, agent.ResultLimitExceeded, agent.ResultError} {
			m.acquired[acquiredKey{mode, result}] = acquiredMetrics{
				count: m.acquisitions.WithLabelValues(mode.String(), result),
				wait:  m.acquireWait.WithLabelValues(result),
			}
		}
	}
	m.reg.MustRegister(m.acquisitions, m.acquireWait, m.renewBatch, m.renewLatency, m.renewFailed, m.lost, m.backendErrs, m.cutOff, m.refused, &m.upgrades,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Acquired counts an acquire; part of agent.Observer.
func (m *Metrics) Acquired(mode backend.Mode, result string, took time.Duration) {
	am, ok := m.acquired[acquiredKey{mode, result}]
	if !ok {
		am = acquiredMetrics{m.acquisitions.WithLabelValues(mode.String(), result), m.acquireWait.WithLabelValues(result)}
	}
	am.count.Inc()
	am.wait.Observe(took.Seconds())
}

// Renewed records a batch of renewals; part of agent.Observer.
func (m *Metrics) Renewed(batch int, took time.Duration, failed int) {
	m.renewBatch.Observe(float64(batch))
	m.renewLatency.Observe(took.Seconds())
	m.renewFailed.Add(float64(failed))
}

// Lost counts a lost lease; part of agent.Observer.
func (m *Metrics) Lost(reason string) { m.lost.WithLabelValues(reason).Inc() }

// BackendError counts a failed backend call; part of agent.Observer.
func (m *Metrics) BackendError(op string) { m.backendErrs.WithLabelValues(op).Inc() }

// CutOff counts a connection cut off; part of socketapi.Observer.
func (m *Metrics) CutOff(reason string) { m.cutOff.WithLabelValues(reason).Inc() }

// AnswerRefused counts an answer refused; part of socketapi.Observer.
func (m *Metrics) AnswerRefused() { m.refused.Inc() }

// Watch registers the gauges read from a at each scrape: sessions, leases
// by mode and scope, waiters, the backend's state, and the agent's build
// and start time.
func (m *Metrics) Watch(a *agent.Agent) {
	m.reg.MustRegister(&gauges{a: a})
}

// Handler serves the metrics in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Serve serves /metrics on ln until ctx is done, then shuts the server
// down and returns nil.
func (m *Metrics) Serve(ctx context.Context, ln net.Listener) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 30 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv.Shutdown(sctx)
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// gauges reads the agent's counts when scraped.
type gauges struct{ a *agent.Agent }

var (
	sessionsDesc = prometheus.NewDesc("lockagent_sessions", "Open sessions, attached to a connection or waiting to be resumed.", nil, nil)
	leasesDesc   = prometheus.NewDesc("lockagent_leases", "Leases held, by mode and scope.", []string{"mode", "scope"}, nil)
	waitersDesc  = prometheus.NewDesc("lockagent_waiters", "Acquire requests waiting in a queue.", nil, nil)
	degradedDesc = prometheus.NewDesc("lockagent_backend_degraded", "1 while renewals are failing (leases stay valid until their local deadline), else 0.", nil, nil)
	infoDesc     = prometheus.NewDesc("lockagent_info", "The agent's version and backend; always 1.", []string{"version", "backend"}, nil)
	startDesc    = prometheus.NewDesc("lockagent_start_time_seconds", "When the agent started, in seconds since the Unix epoch.", nil, nil)
)

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{sessionsDesc, leasesDesc, waitersDesc, degradedDesc, infoDesc, startDesc} {
		ch <- d
	}
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	st := g.a.Stats()
	info := g.a.Info()
	degraded := 0.0
	if st.Degraded {
		degraded = 1
	}
	ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(st.Sessions))
	ch <- prometheus.MustNewConstMetric(waitersDesc, prometheus.GaugeValue, float64(st.Waiters))
	ch <- prometheus.MustNewConstMetric(degradedDesc, prometheus.GaugeValue, degraded)
	ch <- prometheus.MustNewConstMetric(infoDesc, prometheus.GaugeValue, 1, info.Version, info.Backend)
	ch <- prometheus.MustNewConstMetric(startDesc, prometheus.GaugeValue, float64(g.a.Started().UnixNano())/1e9)
	for _, lc := range g.a.LeaseCounts() {
		ch <- prometheus.MustNewConstMetric(leasesDesc, prometheus.GaugeValue, float64(lc.N), lc.Mode.String(), lc.Scope.String())
	}
}
