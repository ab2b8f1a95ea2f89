backend "etcd" {
  endpoints = ["10.0.0.1:2379", "http://10.0.0.2:2379"]
}
