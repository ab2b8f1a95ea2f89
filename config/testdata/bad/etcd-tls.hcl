backend "etcd" {
  endpoints = ["127.0.0.1:2379"]

  tls {
    key_file = "/etc/lockagent/etcd-client.key"
  }
}
