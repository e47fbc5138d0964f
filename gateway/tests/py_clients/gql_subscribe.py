"""Python's gql, as a user writes it: the websockets transport with its
defaults, subscribing to the gateway's tagChanges and running a query over
the same socket.

Usage: gql_subscribe.py WS_URL REPOSITORY TAG

Prints `PUSH REPOSITORY:TAG` once the first event (the current digest) has
arrived, so the test pushes a new image there, then, once the change has
arrived, one JSON document: the events, the query's answer, and what the
connection negotiated.
"""

import asyncio
import json
import sys

from gql import Client, GraphQLRequest, gql
from gql.transport.websockets import WebsocketsTransport

SUBSCRIPTION = gql(
    """
    subscription Watch($repository: String!, $tag: String!) {
      tagChanges(repository: $repository, tag: $tag) { repository tag digest mediaType }
    }
    """
)
QUERY = gql("{ fanoutBudget { limit } }")


async def main(url: str, repository: str, tag: str) -> None:
    transport = WebsocketsTransport(url=url)
    events = []
    async with Client(transport=transport) as session:
        query = await session.execute(QUERY)
        watch = GraphQLRequest(
            SUBSCRIPTION, variable_values={"repository": repository, "tag": tag}
        )
        async for result in session.subscribe(watch, get_execution_result=True):
            events.append({"data": result.data, "extensions": result.extensions})
            if len(events) == 1:
                print(f"PUSH {repository}:{tag}", flush=True)
            else:
                break
        websocket = transport.adapter.websocket
        negotiated = {
            # What the websockets library read from the answer's header.
            "websocket": websocket.subprotocol,
            # What gql speaks (read from the same header by its exact case).
            "gql": transport.subprotocol,
            "header_names": [name for name, _ in websocket.response.headers.raw_items()],
        }
    print(json.dumps({"events": events, "query": query, "subprotocol": negotiated}))


if __name__ == "__main__":
    asyncio.run(asyncio.wait_for(main(*sys.argv[1:4]), timeout=60))
