backend "etcd" {
  endpoints  = ["127.0.0.1:2379"]
  key_prefix = ""
}
