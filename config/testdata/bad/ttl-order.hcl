leases {
  min_ttl     = "1s"
  default_ttl = "2m"
  max_ttl     = "1m"
}
