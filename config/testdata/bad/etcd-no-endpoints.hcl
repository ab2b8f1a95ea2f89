backend "etcd" {
  key_prefix = "locks"
}
