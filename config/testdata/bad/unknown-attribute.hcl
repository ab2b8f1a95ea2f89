socket {
  path  = "/run/lockagent/agent.sock"
  owner = "root"
}
