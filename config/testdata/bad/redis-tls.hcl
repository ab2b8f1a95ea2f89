backend "redis" {
  addresses = ["127.0.0.1:6379"]

  tls {
    cert_file = "/etc/lockagent/client.pem"
  }
}
