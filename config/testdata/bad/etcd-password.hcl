backend "etcd" {
  endpoints = ["127.0.0.1:2379"]
  username  = "lockagent"
  password  = "hunter2"
}
