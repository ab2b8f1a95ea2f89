leases {
  min_ttl = "10ms"
}
