leases {
  default_ttl = "15x"
}
