backend "redis" {
  addresses = ["127.0.0.1:6379"]
  tls { ca_file = "" cert_file = "" key_file = "" }
}
