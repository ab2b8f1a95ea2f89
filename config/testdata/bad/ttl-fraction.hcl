leases {
  default_ttl = "1.0005s"
}
