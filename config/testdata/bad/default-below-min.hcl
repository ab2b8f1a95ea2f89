leases {
  min_ttl = "20s"
}
