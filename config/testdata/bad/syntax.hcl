socket {
  path = "/run/lockagent/agent.sock"
