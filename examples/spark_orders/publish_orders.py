"""Publish orders to hutch's `orders` queue (declaring the topology first).

    python examples/spark_orders/publish_orders.py --uri amqp://guest:guest@localhost:5672/%2F \
        --count 100000 --rate 2000
"""

from __future__ import annotations

import argparse

from orders import declare_topology, publish_orders


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--uri", default="amqp://guest:guest@localhost:5672/%2F")
    ap.add_argument("--count", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=1000.0, help="orders per second (0: as fast as possible)")
    ap.add_argument("--first", type=int, default=0, help="number of the first order (order ids o-<n>)")
    args = ap.parse_args()
    declare_topology(args.uri)
    took = publish_orders(args.uri, args.count, args.rate, first=args.first)
    print(f"published {args.count} orders in {took:.1f} s ({args.count / took:.0f}/s), all confirmed")


if __name__ == "__main__":
    main()
