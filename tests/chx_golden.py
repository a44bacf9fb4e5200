"""What RabbitMQ 3.10.8's consistent-hash exchange did, observed by hand, for the pure and interop tests.

Taken against the local RabbitMQ 3.10.8 (consistent-hash plugin enabled) with pika: an exchange of type
x-consistent-hash, queues q0..q4 bound in the order of WEIGHTS with those weights as binding keys, every key
published once, and the queue each message was found in recorded (docs/routing.md says how to take them again).
"""

# RabbitMQ 3.10.8: queues q0..q4 bound in this order with these weights, then keys published
WEIGHTS = [("q0", 1), ("q1", 2), ("q2", 5), ("q3", 3), ("q4", 10)]
ROUTING_KEY_TO_QUEUE = {
    'key-0': 4, 'key-5': 2, 'key-10': 3, 'key-15': 4, 'key-20': 4, 'key-25': 2, 'key-30': 4, 'key-35': 2,
    'key-40': 2, 'key-45': 1, 'key-50': 4, 'key-55': 1, 'key-60': 2, 'key-65': 4, 'key-70': 4, 'key-75': 2,
    'key-80': 4, 'key-85': 0, 'key-90': 4, 'key-95': 2, 'key-100': 1, 'key-105': 4, 'key-110': 2,
    'key-115': 2, 'key-120': 2, 'key-125': 4, 'key-130': 0, 'key-135': 3, 'key-140': 4, 'key-145': 3,
    'key-150': 4, 'key-155': 3, 'key-160': 1, 'key-165': 3, 'key-170': 4, 'key-175': 2, 'key-180': 4,
    'key-185': 2, 'key-190': 2, 'key-195': 4, 'key-200': 4, 'key-205': 4, 'key-210': 4, 'key-215': 2,
    'key-220': 1, 'key-225': 1, 'key-230': 3, 'key-235': 4, 'key-240': 1, 'key-245': 4, 'key-250': 2,
    'key-255': 4, 'key-260': 3, 'key-265': 1, 'key-270': 4, 'key-275': 4, 'key-280': 2, 'key-285': 2,
    'key-290': 1, 'key-295': 4, '': 4, 'a': 4, 'hello': 4, 'order-42': 4, 'ü-unicode': 1,
}
# the same exchange after `queue.unbind q2 5`
AFTER_UNBIND_Q2 = {
    'key-0': 4, 'key-5': 4, 'key-10': 4, 'key-15': 4, 'key-20': 4, 'key-25': 4, 'key-30': 4, 'key-35': 4,
    'key-40': 4, 'key-45': 1, 'key-50': 4, 'key-55': 1, 'key-60': 3, 'key-65': 4, 'key-70': 4, 'key-75': 3,
    'key-80': 0, 'key-85': 0, 'key-90': 4, 'key-95': 3,
}
# hash-property message_id, and timestamp
MESSAGE_ID = {
    'm0': 2, 'm3': 3, 'm6': 1, 'm9': 1, 'm12': 2, 'm15': 4, 'm18': 4, 'm21': 0, 'm24': 2, 'm27': 4, 'm30': 4,
    'm33': 2, 'm36': 1, 'm39': 2, 'm42': 0, 'm45': 4, 'm48': 4, 'm51': 3, 'm54': 3, 'm57': 4,
}
TIMESTAMP = {
    1700000000: 4, 1700015838: 4, 1700031676: 2, 1700047514: 3, 1700063352: 0, 1700079190: 2, 1700095028: 4,
    1700110866: 4, 1700126704: 4, 1700142542: 4, 1700158380: 3, 1700174218: 4, 1700190056: 4, 1700205894: 4,
    1700221732: 4,
}
# hash-header: 3.10.8 hashes rabbit_misc:table_lookup's {longstr, Value}; 4.x (hutch) hashes the bare value
HEADER_3_10 = {
    'v0': 2, 'v4': 4, 'v8': 2, 'v12': 4, 'v16': 4, 'v20': 3, 'v24': 4, 'v28': 3, 'v32': 1, 'v36': 4,
    'v40': 2, 'v44': 0, 'v48': 4, 'v52': 4, 'v56': 2,
}

