"""Tests of leader election (campaign, elected, resign) against a real agent."""

import unittest

import lockagent
from harness import AgentTestCase, break_connection, drop_answer_with_connection, wait_until
from test_lockagent_async import AsyncAgentTestCase


class CampaignTest(AgentTestCase):
    def test_one_leader_at_a_time_and_resign_hands_over(self):
        a, b = self.client(), self.client()
        ca = a.campaign("leader/x", meta="a")
        lease_a = ca.wait_elected(5)
        self.assertIsInstance(lease_a, lockagent.Lease)
        self.assertEqual((lease_a.name, lease_a.mode), ("leader/x", "exclusive"))
        self.assertIs(ca.leader, lease_a)
        self.assertEqual(b.inspect("leader/x").holders[0].meta, "a")
        cb = b.campaign("leader/x", meta="b")
        self.assertIsNone(cb.wait_elected(0.2))
        self.assertIsNone(cb.leader)
        self.assertTrue(ca.resign())
        self.assertFalse(ca.resign())
        self.assertFalse(lease_a.active)
        self.assertFalse(lease_a.lost)
        with self.assertRaises(lockagent.CampaignEnded) as cm:
            ca.wait_elected(0)
        self.assertEqual(cm.exception.reason, lockagent.RESIGNED)
        lease_b = cb.wait_elected(5)
        self.assertGreater(lease_b.token, lease_a.token)
        self.assertEqual(a.inspect("leader/x").holders[0].token, lease_b.token)

    def test_a_lost_term_is_followed_by_the_next(self):
        c = self.client()
        terms = []
        campaign = c.campaign("leader/x")
        campaign.add_elected_callback(terms.append)
        first = campaign.wait_elected(5)
        out = self.agent.ctl("break", "leader/x")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertTrue(first.wait_lost(5))
        self.assertEqual(first.lost_reason, "broken")
        second = campaign.wait_elected(5)
        self.assertIsNot(second, first)
        self.assertGreater(second.token, first.token)
        self.assertEqual(terms, [first, second])

    def test_releasing_the_lease_ends_the_term_only(self):
        c = self.client()
        campaign = c.campaign("leader/x")
        first = campaign.wait_elected(5)
        self.assertTrue(first.release())
        self.assertFalse(first.lost)
        second = campaign.wait_elected(5)
        self.assertGreater(second.token, first.token)
        self.assertFalse(campaign.ended)

    def test_context_manager_resigns(self):
        a, b = self.client(), self.client()
        with a.campaign("leader/x") as campaign:
            lease = campaign.wait_elected(5)
        self.assertEqual(campaign.ended_reason, "resigned")
        self.assertFalse(lease.active)
        self.assertGreater(b.campaign("leader/x").wait_elected(5).token, lease.token)

    def test_a_broken_connection_ends_the_campaign(self):
        a, b = self.client(), self.client()
        ca = a.campaign("leader/x")
        lease = ca.wait_elected(5)
        cb = b.campaign("leader/x")
        break_connection(a)
        self.assertTrue(lease.wait_lost(5))
        with self.assertRaises(lockagent.CampaignEnded) as cm:
            ca.wait_elected(5)
        self.assertEqual(cm.exception.reason, "connection_lost")
        self.assertGreater(cb.wait_elected(5).token, lease.token)

    def test_a_session_campaign_survives_a_resume(self):
        c = self.client(session_ttl=30)
        campaign = c.campaign("leader/x", scope="session", ttl=5)
        lease = campaign.wait_elected(5)
        self.assertEqual((lease.scope, lease.ttl_ms), ("session", 5000))
        break_connection(c)
        self.assertTrue(lease.check().held)
        self.assertTrue(c.resumed)
        self.assertFalse(campaign.ended)
        self.assertIs(campaign.wait_elected(0), lease)

    def test_a_resign_whose_answer_was_lost_ends_the_campaign_on_resume(self):
        c = self.client(session_ttl=5)
        lost = []
        campaign = c.campaign("leader/x", scope="session")
        lease = campaign.wait_elected(5)
        lease.add_lost_callback(lost.append)
        drop_answer_with_connection(c, lambda msg: msg.get("resigned"))
        with self.assertRaises(lockagent.AgentConnectionError):
            campaign.resign()
        wait_until(lambda: c.connected and c.resumed, 10, "the client to resume")
        self.assertEqual([s["campaigns"] for s in c.list_sessions()
                          if s["session"] == c.session], [[]])
        self.assertTrue(campaign.ended)
        self.assertEqual(campaign.ended_reason, lockagent.RESIGNED)
        self.assertFalse(campaign.resign())
        with self.assertRaises(lockagent.CampaignEnded):
            campaign.wait_elected()
        self.assertFalse(lease.active)
        self.assertFalse(lease.lost, "the client resigned it")
        self.assertEqual(lost, [])

    def test_resign_of_a_campaign_resigned_meanwhile_ends_it(self):
        # The agent says not_held: the campaign ended, unbeknown to the client.
        c = self.client()
        campaign = c.campaign("leader/x")
        campaign.wait_elected(5)
        c.call("resign", campaign=campaign.id)
        self.assertFalse(campaign.resign())
        self.assertEqual(campaign.ended_reason, lockagent.RESIGNED)
        with self.assertRaises(lockagent.CampaignEnded):
            campaign.wait_elected(2)
        self.assertIsNone(campaign.leader)

    def test_resign_of_an_unknown_campaign(self):
        with self.assertRaises(lockagent.NotHeld):
            self.client().call("resign", campaign="c_unknown")


class AsyncCampaignTest(AsyncAgentTestCase):
    async def test_elected_awaited_and_resigned(self):
        a, b = await self.client(), await self.client()
        async with await a.campaign("leader/x") as ca:
            lease = await ca.wait_elected(5)
            self.assertIsInstance(lease, lockagent.AsyncLease)
            cb = await b.campaign("leader/x")
            self.assertIsNone(await cb.wait_elected(0.1))
        self.assertTrue(ca.ended)
        self.assertGreater((await cb.wait_elected(5)).token, lease.token)
        await a.break_lock("leader/x")
        with self.assertRaises(lockagent.CampaignEnded):
            await ca.wait_elected(0)


if __name__ == "__main__":
    unittest.main()
