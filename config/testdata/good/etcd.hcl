# An etcd backend of three members, with TLS and a user.

backend "etcd" {
  endpoints           = ["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"]
  key_prefix          = "locks"
  username            = "lockagent"
  password_credential = "etcd.password" # never a password inline
  dial_timeout        = "2s"
  request_timeout     = "3s"

  tls {
    ca_file   = "/etc/lockagent/etcd-ca.pem"
    cert_file = "/etc/lockagent/etcd-client.pem"
    key_file  = "/etc/lockagent/etcd-client.key"
  }
}
