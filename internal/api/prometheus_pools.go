package api

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentbox/agentbox/internal/sandbox/pools"
)

// Warm pools' series, read at scrape time; one series per pool and family, at most
// sandbox.MaxPools pools.
var (
	poolLabels       = []string{"pool"}
	descPoolReady    = prometheus.NewDesc("agentbox_pool_ready", "Ready sandboxes a warm pool holds.", poolLabels, nil)
	descPoolStarting = prometheus.NewDesc("agentbox_pool_starting", "Sandboxes being started for a warm pool.", poolLabels, nil)
	descPoolSize     = prometheus.NewDesc("agentbox_pool_size", "The ready sandboxes a warm pool is to keep (its target).", poolLabels, nil)
	descPoolHits     = prometheus.NewDesc("agentbox_pool_hits_total", "Creates that claimed a ready sandbox from a warm pool (since the server started).", poolLabels, nil)
	descPoolMisses   = prometheus.NewDesc("agentbox_pool_misses_total", "Creates of a warm pool's shape that found none ready and started one (since the server started).", poolLabels, nil)
)

// poolCollector reports the warm pools.
type poolCollector struct{ pools *pools.Service }

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPoolReady, descPoolStarting, descPoolSize, descPoolHits, descPoolMisses} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), collectTimeout)
	defer cancel()
	pools, err := c.pools.ListPools(ctx)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descPoolReady, err)
		return
	}
	for _, p := range pools {
		ch <- prometheus.MustNewConstMetric(descPoolReady, prometheus.GaugeValue, float64(p.Ready), p.Name)
		ch <- prometheus.MustNewConstMetric(descPoolStarting, prometheus.GaugeValue, float64(p.Starting), p.Name)
		ch <- prometheus.MustNewConstMetric(descPoolSize, prometheus.GaugeValue, float64(p.Size), p.Name)
		ch <- prometheus.MustNewConstMetric(descPoolHits, prometheus.CounterValue, float64(p.Hits), p.Name)
		ch <- prometheus.MustNewConstMetric(descPoolMisses, prometheus.CounterValue, float64(p.Misses), p.Name)
	}
}
